"""Conversation sessions on a real `hotplate serve` (uvicorn on loopback, real workers),
played by real aiortc peers over ICE on 127.0.0.1 (testkit/webrtc_peer.py); the mouth is
read from the decoded pictures (testkit/mouth_reader.py). Every wait has a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from cachestore.leases import live_leases
from cachestore.store import forget_store, open_store
from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio
from hotplate.serve.config import TURN_ENV
from pipeline.hot import load_assets
from testkit.mouth_reader import AT_REST, OPEN, MouthReader
from testkit.serve_helpers import Server, assert_problem, make_world, precompiled, speak
from testkit.turn import Coturn
from testkit.webrtc_peer import WhepPeer, audio_since, rms, trickle_fragment

pytestmark = pytest.mark.slow
ICE_TIMEOUT = 3.0  # s: HOTPLATE_SESSION_ICE_TIMEOUT for these servers
ASTRO = {"persona": "astro", "attire": "studio"}
RELAYED = 50_000  # bytes coturn relays to a relay-only player in 2 s of pictures, at least
# (measured 138 kB at 270x480)
ENV = {"HOTPLATE_SESSION_ICE_TIMEOUT": str(ICE_TIMEOUT), "HOTPLATE_SESSION_OFFER_TIMEOUT": "30"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("sessions"), attires=("studio", "evening"))


@pytest.fixture(scope="module")
def server(world):
    with Server(world, "--workers", "2", "--max-sessions", "2", env=ENV) as srv:
        srv.avatar = precompiled(srv)
        precompiled(srv, "evening")
        yield srv


@pytest.fixture(scope="module")
def reader(server, world):
    store = open_store(world / "cache")
    yield MouthReader(load_assets(store, server.avatar))
    forget_store(world / "cache")


def pcm(seconds: float, rate: int = 24000, seed: int = 0) -> bytes:
    return (make_speech_audio(seconds, rate, seed) * 32767).astype("<i2").tobytes()


async def until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def gone(c: httpx.AsyncClient, sid: str, timeout: float = 20.0) -> None:
    async def ended() -> bool:
        return (await c.get(f"/v1/sessions/{sid}")).status_code == 404

    deadline = time.monotonic() + timeout
    while not await ended():
        if time.monotonic() > deadline:
            raise AssertionError(f"session {sid} still live after {timeout} s")
        await asyncio.sleep(0.1)


def ended_lines(srv: Server, sid: str) -> list[str]:
    text = (srv.root / f"serve-{srv.port}.log").read_text(errors="replace")
    return [line for line in text.splitlines() if f"session {sid} ended" in line]


async def wait_ended_line(srv: Server, sid: str, timeout: float = 20.0) -> str:
    await until(lambda: ended_lines(srv, sid), timeout, f"session {sid}'s end in the log")
    lines = ended_lines(srv, sid)
    assert len(lines) == 1, lines  # one line per session
    return lines[0]


def openings(peer: WhepPeer, reader: MouthReader, since: float, until_t: float = 1e18):
    return [(t, *reader.read(luma)) for t, luma in peer.received.video if since <= t < until_t]


def media_times(peer: WhepPeer, since: float) -> list[float]:
    """The media time (s, the sender's frame clock) of each picture arrived since `since`."""
    got = zip(peer.received.video, peer.received.video_media, strict=True)
    return [m for (t, _), m in got if t >= since and m is not None]


def said_after(peer: WhepPeer, reader: MouthReader, since: float, media: float) -> list:
    """(media time, idx, score) of the pictures arrived since `since` whose media time is
    past `media`."""
    got = zip(peer.received.video, peer.received.video_media, strict=True)
    return [(m, *reader.read(y)) for (t, y), m in got if t >= since and m is not None and m > media]


def test_a_session_listens_talks_and_is_interrupted(server, world, reader):
    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            r = await c.post("/v1/sessions", json=ASTRO)
            assert r.status_code == 201, r.text
            s = r.json()
            assert set(s) >= {"id", "whep", "speech", "interrupt"}
            assert r.headers["location"] == f"/v1/sessions/{s['id']}"
            assert live_leases(world / "cache", clean=False)  # the session holds its avatar
            peer = WhepPeer()
            answer = await peer.connect(c, s["whep"])
            assert answer.status_code == 201, answer.text
            assert answer.headers["content-type"] == "application/sdp"
            assert answer.headers["location"] == f"/v1/sessions/{s['id']}/whep/peer"
            # host candidates on loopback only: no STUN or TURN server was asked
            candidates = [x for x in answer.text.splitlines() if x.startswith("a=candidate")]
            assert candidates and all(" 127.0.0.1 " in x and "typ host" in x for x in candidates)
            await asyncio.wait_for(peer.received.first_video.wait(), 30)

            # listening: the loop plays on (its frames change), the mouth at rest, silence
            idle_from = time.monotonic()
            await until(lambda: len(openings(peer, reader, idle_from)) >= 25, 30, "1 s of video")
            idle = openings(peer, reader, idle_from)
            assert len({idx for _, idx, _ in idle}) >= 4  # it moves through the loop
            assert max(score for _, _, score in idle) < AT_REST
            assert rms(audio_since(peer.received, idle_from)) < 50

            # a turn: the mouth opens, the audio carries the speech, then rest again
            ws = await speak(server.url, s, pcm(2.0))
            spoke = time.monotonic()
            await until(lambda: len(openings(peer, reader, spoke)) >= 75, 30, "3 s of video")
            turn = openings(peer, reader, spoke, spoke + 2.2)
            assert max(score for _, _, score in turn) > OPEN
            assert rms(audio_since(peer.received, spoke)) > 500
            # at rest once the 2 s are said, by the pictures' own clock (their media time
            # from the first open mouth, which is no earlier than the speech's start): on a
            # loaded machine pictures arrive late, so 2.6 s after the speech was sent by
            # arrival still held some of its last words (a mouth at 9.6 at load 9.5)
            opened = said_after(peer, reader, spoke, -1.0)
            start = next(m for m, _, score in opened if score > OPEN)
            done = start + 2.0 + 0.4  # the renderer's lookahead and fade out, and a margin
            await until(
                lambda: sum(m > done for m in media_times(peer, spoke)) >= 25, 30, "1 s at rest"
            )
            after = said_after(peer, reader, spoke, done)
            assert max(score for _, _, score in after) < AT_REST

            # an interrupt mid-turn: the mouth rests and the audio stops
            await ws.send(pcm(6.0, seed=1))
            await ws.send(json.dumps({"type": "end_of_turn"}))
            talking = time.monotonic()
            await until(
                lambda: any(sc > OPEN for _, _, sc in openings(peer, reader, talking)),
                30,
                "the mouth to open",
            )
            assert (await c.post(s["interrupt"])).status_code == 204
            cut = time.monotonic()
            await until(lambda: len(openings(peer, reader, cut + 0.4)) >= 25, 30, "1 s more")
            rest = openings(peer, reader, cut + 0.4)
            assert max(score for _, _, score in rest) < AT_REST
            parts = [a for t, a in peer.received.audio if t >= cut + 0.4]
            assert rms(np.concatenate(parts)) < 50
            await ws.close()

            figures = (await c.get(f"/v1/sessions/{s['id']}")).json()
            assert figures["connected"] and figures["frames"] >= 100
            assert figures["speaking_frames"] >= 50 and figures["dropped_frames"] == 0
            # the sound's pieces, sent 20 ms apart, arrive in the order of their media time
            # (scheduled apart, a late frame's first could pass its predecessor's second)
            media = [m for m in peer.received.audio_media if m is not None]
            assert len(media) > 100 and bool(np.all(np.diff(media) > 0))
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            await gone(c, s["id"])
            await peer.close()
            line = await wait_ended_line(server, s["id"])
            assert "ended by DELETE" in line
            await until(lambda: not live_leases(world / "cache", clean=False), 20, "no lease")

    asyncio.run(run())


def mouth_mse(reader: MouthReader, luma: np.ndarray) -> float:
    """The mean squared luma error in the mouth's rectangle of a picture at rest, against
    the stored loop frame it shows (what the session rendered)."""
    idx, _ = reader.read(luma)
    x1, y1, x2, y2 = reader.boxes[idx]
    got = luma[y1:y2, x1:x2].astype(np.float64)
    return float(np.mean((got - reader.lumas[idx][y1:y2, x1:x2]) ** 2))


def test_h264_when_offered_vp8_otherwise_and_the_mouth_as_sharp(server, reader):
    """aiortc's offer lists VP8 first, then H.264: the server picks H.264 (its choice, the
    cheaper encode); an offer of VP8 alone gets VP8. Both at once, at rest, with the same
    bitrate start and ceiling: the mouth's PSNR against the rendered frame over H.264 is
    within 3 dB of VP8's here. On this 8-frame loop VP8's golden frame, eight pictures
    back, is the very picture it codes (x264 keeps one reference); on the bench's 50-frame
    loops the two are within 1 dB (bench_webrtc --parts codecs, docs/benchmarks.md)."""
    pictures = 75  # 3 s of each, from its 26th picture on

    async def run() -> dict:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            got = {}
            for offered in (None, ("VP8",)):
                s = (await c.post("/v1/sessions", json=ASTRO)).json()
                peer = WhepPeer(video_codecs=offered)
                answer = await peer.connect(c, s["whep"])
                assert answer.status_code == 201, answer.text
                got[offered] = (s, peer)
            for _, peer in got.values():
                await until(lambda p=peer: len(p.received.video) >= 25 + pictures, 30, "pictures")
            out = {}
            for s, peer in got.values():
                figures = (await c.get(f"/v1/sessions/{s['id']}")).json()
                mse = [mouth_mse(reader, y) for _, y in peer.received.video[25 : 25 + pictures]]
                psnr = 10 * np.log10(255**2 / max(float(np.mean(mse)), 1e-9))
                out[figures["codec"]] = (psnr, peer.received.payload_bytes["video"], figures)
                await c.delete(f"/v1/sessions/{s['id']}")
                await peer.close()
            return out

    out = asyncio.run(run())
    assert sorted(out) == ["H264", "VP8"], sorted(out)
    (h264, h264_bytes, figures), (vp8, vp8_bytes, _) = out["H264"], out["VP8"]
    said = f"H.264 {h264:.2f} dB ({h264_bytes} B), VP8 {vp8:.2f} dB ({vp8_bytes} B)"
    print(f"mouth PSNR: {said}")
    assert h264 >= vp8 - 3.0, said
    split = figures["cpu_ms_per_frame"]  # where the worker's CPU went, per frame
    assert set(split) >= {"render", "fetch", "encode", "packetise", "send", "sound", "rest"}
    assert split["encode"] > 0 and split["render"] > 0, split
    assert figures["worker"]["rss_bytes"] > 0, figures["worker"]


def test_the_caps_answer_503_with_retry_after_and_a_freed_worker_serves_again(server):
    with server.client() as c:
        first = c.post("/v1/sessions", json=ASTRO)
        second = c.post("/v1/sessions", json=ASTRO)
        assert first.status_code == second.status_code == 201, (first.text, second.text)
        full = c.post("/v1/sessions", json=ASTRO)
        assert_problem(full, 503, "--max-sessions")
        assert int(full.headers["retry-after"]) > 0
        assert c.delete(f"/v1/sessions/{first.json()['id']}").status_code == 204
        again = c.post("/v1/sessions", json=ASTRO)
        assert again.status_code == 201, again.text
        for r in (second, again):
            assert c.delete(f"/v1/sessions/{r.json()['id']}").status_code == 204
        assert_problem(c.post("/v1/sessions", json={**ASTRO, "attire": "nope"}), 404, "nope")


def test_a_malformed_offer_or_a_peer_that_never_connects_ends_that_session_alone(server):
    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            good = (await c.post("/v1/sessions", json=ASTRO)).json()
            peer = WhepPeer()
            assert (await peer.connect(c, good["whep"])).status_code == 201
            await asyncio.wait_for(peer.received.first_video.wait(), 30)

            bad = (await c.post("/v1/sessions", json=ASTRO)).json()
            r = await c.post(
                bad["whep"],
                content=b"v=0\r\nthis is no SDP",
                headers={"content-type": "application/sdp"},
            )
            assert_problem(r, 400, "SDP")
            await gone(c, bad["id"])
            assert "malformed offer" in await wait_ended_line(server, bad["id"])
            wrong = await c.post(
                good["whep"], content=b"v=0", headers={"content-type": "text/plain"}
            )
            assert_problem(wrong, 415, "application/sdp")

            # an offer whose peer never applies the answer: no ICE, ended in ICE_TIMEOUT
            mute = (await c.post("/v1/sessions", json=ASTRO)).json()
            silent = WhepPeer()
            assert (await silent.connect(c, mute["whep"], answer=False)).status_code == 201
            asked = time.monotonic()
            await gone(c, mute["id"], ICE_TIMEOUT + 15)
            assert "did not complete ICE" in await wait_ended_line(server, mute["id"])
            # each said in its one line, and nothing more (no worker's traceback)
            log = server.log_text(tail=None)
            assert "Traceback" not in log, log[log.index("Traceback") - 500 :][:3000]
            print(f"no-ICE session ended {time.monotonic() - asked:.1f} s after its answer")
            await silent.close()

            # the good session played on throughout
            now = time.monotonic()
            await until(lambda: any(t > now for t, _ in peer.received.video), 10, "video")
            assert (await c.get(f"/v1/sessions/{good['id']}")).status_code == 200
            await c.delete(f"/v1/sessions/{good['id']}")
            await peer.close()

    asyncio.run(run())


def test_a_player_trickles_its_candidates_after_its_offer(server):
    """WHEP's trickle ICE: an offer with no candidates, then a PATCH of them as an SDP
    fragment before the player starts its checks. ICE knows the player's address from
    the PATCH (a host candidate), and the session plays. The same offer with no PATCH
    connects too, on an address ICE learnt from the checks alone (prflx): the figure
    tells the two apart. An ICE restart, a wrong type, a bad candidate, a PATCH before
    the offer or after end-of-candidates: one line each, and the session plays on."""
    frag_type = {"content-type": "application/trickle-ice-sdpfrag"}

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            location = f"/v1/sessions/{s['id']}/whep/peer"
            early = await c.patch(location, content=b"a=end-of-candidates", headers=frag_type)
            assert_problem(early, 409, "POST the offer")
            peer = WhepPeer()
            r = await peer.connect(c, s["whep"], candidates="patch")
            assert r.headers["location"] == location
            await asyncio.wait_for(peer.received.first_video.wait(), 30)
            ice = (await c.get(f"/v1/sessions/{s['id']}")).json()["ice"]
            assert ice["trickled"] >= 1 and ice["remote_candidates"].get("host", 0) >= 1, ice
            assert "prflx" not in ice["remote_candidates"], ice

            fragment = trickle_fragment(peer.pc.localDescription.sdp)
            wrong = await c.patch(
                location, content=fragment, headers={"content-type": "text/plain"}
            )
            assert_problem(wrong, 415, "application/trickle-ice-sdpfrag")
            restart = await c.patch(
                location, content=fragment, headers={**frag_type, "if-match": "*"}
            )
            assert_problem(restart, 422, "ICE restarts are not supported")
            other = re.sub(r"a=ice-ufrag:\S+", "a=ice-ufrag:another", fragment)
            assert_problem(
                await c.patch(location, content=other, headers=frag_type), 422, "restart"
            )
            bad = "a=mid:0\r\na=candidate:1 1 udp\r\n"
            assert_problem(await c.patch(location, content=bad, headers=frag_type), 400, "RFC 8839")
            # the fragment said end-of-candidates: a candidate after it is refused
            more = fragment.replace("a=end-of-candidates\r\n", "")
            late = await c.patch(location, content=more, headers=frag_type)
            assert_problem(late, 400, "end-of-candidates")
            now = time.monotonic()
            await until(lambda: any(t > now for t, _ in peer.received.video), 10, "video")
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            await peer.close()

            # the control: no candidates sent at all, learnt from the checks
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            blind = WhepPeer()
            assert (await blind.connect(c, s["whep"], candidates="none")).status_code == 201
            await asyncio.wait_for(blind.received.first_video.wait(), 30)
            ice = (await c.get(f"/v1/sessions/{s['id']}")).json()["ice"]
            assert ice["trickled"] == 0 and set(ice["remote_candidates"]) == {"prflx"}, ice
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            await blind.close()

    asyncio.run(run())


VANISHING_PEER = """
import asyncio, sys, httpx
from testkit.webrtc_peer import WhepPeer
async def main():
    async with httpx.AsyncClient(base_url=sys.argv[1], timeout=60) as c:
        peer = WhepPeer()
        await peer.connect(c, sys.argv[2])
        await asyncio.wait_for(peer.received.first_video.wait(), 60)
        print("playing", flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
"""


def test_a_peer_that_vanishes_mid_session_ends_it_within_seconds(server, world):
    with server.client() as c:
        s = c.post("/v1/sessions", json=ASTRO).json()
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        proc = subprocess.Popen(
            [sys.executable, "-c", VANISHING_PEER, server.url, s["whep"]],
            stdout=subprocess.PIPE,
            env=env,
        )
        try:
            assert proc.stdout.readline().strip() == b"playing"
            assert c.get(f"/v1/sessions/{s['id']}").json()["connected"]
        finally:
            proc.send_signal(signal.SIGKILL)  # no goodbye: its packets just stop
            proc.wait(timeout=30)
        killed = time.monotonic()
        deadline = killed + 30
        while c.get(f"/v1/sessions/{s['id']}").status_code != 404:
            assert time.monotonic() < deadline, "the session outlived its peer by 30 s"
            time.sleep(0.2)
        print(f"vanished peer's session ended {time.monotonic() - killed:.1f} s after the kill")
        line = asyncio.run(wait_ended_line(server, s["id"]))
        assert "the peer went away" in line
        # its worker is free: two sessions fit again
        made = [c.post("/v1/sessions", json=ASTRO) for _ in range(2)]
        assert [r.status_code for r in made] == [201, 201], [r.text for r in made]
        for r in made:
            c.delete(f"/v1/sessions/{r.json()['id']}")


def test_microphone_data_channel_http_speech_and_switch(server, reader):
    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            mic = np.frombuffer(pcm(2.0, 48000, seed=2), "<i2")
            peer = WhepPeer(mic=np.concatenate([np.zeros(24000, np.int16), mic]), channel=True)
            assert (await peer.connect(c, s["whep"])).status_code == 201
            await asyncio.wait_for(peer.received.first_video.wait(), 30)
            start = time.monotonic()
            # the microphone's speech (after 0.5 s of silence) opens the mouth
            await until(
                lambda: any(sc > OPEN for _, _, sc in openings(peer, reader, start)),
                30,
                "the microphone to open the mouth",
            )
            await until(lambda: time.monotonic() > start + 3.0, 10, "the microphone to end")

            # PCM posted over HTTP (chunked), interrupted over the data channel
            async def body():
                data = pcm(6.0, 16000, seed=3)
                for at in range(0, len(data), 16000):
                    yield data[at : at + 16000]

            posted = await c.post(
                f"/v1/sessions/{s['id']}/speech",
                params={"sample_rate": 16000, "channels": 1},
                content=body(),
            )
            assert posted.status_code == 204, posted.text
            talking = time.monotonic()
            await until(
                lambda: any(sc > OPEN for _, _, sc in openings(peer, reader, talking)),
                30,
                "the posted speech to open the mouth",
            )
            await peer.wait_open()
            peer.channel.send("interrupt")
            cut = time.monotonic()
            await until(lambda: len(openings(peer, reader, cut + 0.4)) >= 25, 30, "1 s more")
            assert max(sc for _, _, sc in openings(peer, reader, cut + 0.4)) < AT_REST

            r = await c.post(f"/v1/sessions/{s['id']}/switch", json={"attire": "evening"})
            assert r.status_code == 204, r.text
            bad = await c.post(f"/v1/sessions/{s['id']}/switch", json={"attire": "nope"})
            assert_problem(bad, 404, "nope")
            await c.delete(f"/v1/sessions/{s['id']}")
            await peer.close()

    asyncio.run(run())


def test_sessions_need_the_token_and_answer_only_their_client(tmp_path):
    root = make_world(tmp_path)
    (root / "tokens").write_text("alice-token\nbob-token\n")
    args = (
        "--workers",
        "2",
        "--token-file",
        str(root / "tokens"),
        "--max-sessions-per-client",
        "1",
    )
    alice = {"authorization": "Bearer alice-token"}
    bob = {"authorization": "Bearer bob-token"}
    with Server(root, *args, env=ENV) as srv:
        with srv.client() as c:
            assert_problem(c.post("/v1/sessions", json=ASTRO), 401, "token")
            r = c.post("/v1/sessions", json=ASTRO, headers=alice)
            assert r.status_code == 201, r.text
            s = r.json()
            assert re.search(r"[?&]sig=", s["speech"])  # a browser's WebSocket sends no header
            assert_problem(c.post("/v1/sessions", json=ASTRO, headers=alice), 503, "per-client")
            # another client's token: 404 on every route of the session, which lives on
            base, sdp = f"/v1/sessions/{s['id']}", {"content-type": "application/sdp"}
            frag = {"content-type": "application/trickle-ice-sdpfrag"}
            for method, path, kw in [
                ("GET", base, {}),
                ("DELETE", base, {}),
                ("POST", s["whep"], {"content": b"v=0\r\n", "headers": sdp}),
                (
                    "PATCH",
                    f"{base}/whep/peer",
                    {"content": b"a=end-of-candidates", "headers": frag},
                ),
                ("DELETE", f"{base}/whep/peer", {}),
                ("POST", f"{base}/speech?sample_rate=16000", {"content": pcm(0.2, 16000)}),
                ("POST", s["interrupt"], {}),
                ("POST", s["switch"], {"json": {"attire": "studio"}}),
            ]:
                headers = {**bob, **kw.pop("headers", {})}
                answer = c.request(method, path, headers=headers, **kw)
                assert_problem(answer, 404, "no live session")
            assert c.get(base, headers=alice).status_code == 200
            assert c.post(s["interrupt"], headers=alice).status_code == 204

            async def socket(url: str) -> str:
                import websockets

                async with websockets.connect(url) as ws:
                    await ws.send(json.dumps({"sample_rate": 16000, "channels": 1}))
                    await ws.send(pcm(0.2, 16000))
                    await ws.send(json.dumps({"type": "end_of_turn"}))
                    await ws.send(json.dumps({"type": "bogus"}))
                    return json.loads(await ws.recv())["detail"]

            ws_url = srv.url.replace("http", "ws", 1)
            assert "end_of_turn" in asyncio.run(socket(ws_url + s["speech"]))  # signed: in

            async def bobs_socket() -> tuple[int, str]:
                import websockets

                url = ws_url + s["speech"].split("?")[0]
                async with websockets.connect(url, additional_headers=bob) as ws:
                    with contextlib.suppress(Exception):
                        await ws.send(json.dumps({"sample_rate": 16000, "channels": 1}))
                    await asyncio.wait_for(ws.wait_closed(), 20)
                    return ws.close_code, ws.close_reason

            code, reason = asyncio.run(bobs_socket())
            assert code == 1008 and "no live session" in reason, (code, reason)
            assert c.get(f"/v1/sessions/{s['id']}", headers=alice).status_code == 200
            unsigned = s["speech"].split("?")[0]
            with pytest.raises(Exception, match="1008|403|rejected"):
                asyncio.run(socket(ws_url + unsigned))
            assert c.delete(f"/v1/sessions/{s['id']}", headers=alice).status_code == 204

        # a drain (SIGTERM) ends a playing session at once: a conversation never ends
        # by itself, and the drain would wait its whole --drain-timeout (60 s) for it
        async def drained_while_playing() -> tuple[str, float]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60, headers=bob) as ac:
                s = (await ac.post("/v1/sessions", json=ASTRO)).json()
                peer = WhepPeer()
                assert (await peer.connect(ac, s["whep"])).status_code == 201
                await asyncio.wait_for(peer.received.first_video.wait(), 30)
            began = time.monotonic()
            await asyncio.to_thread(srv.stop)  # the peer plays on meanwhile
            took = time.monotonic() - began
            await peer.close()
            return s["id"], took

        sid, took = asyncio.run(drained_while_playing())
        assert srv.proc.returncode == 0 and took < 30, (srv.proc.returncode, took)
        assert "the server is shutting down" in "\n".join(ended_lines(srv, sid))


def test_a_turn_server_relays_with_its_credentials_and_a_refusal_is_one_line(tmp_path):
    """A real coturn on loopback (long-term credentials): with the right ones the answer
    carries its relay candidate and coturn logs the allocation under that user; with
    wrong ones the session still plays over its host candidate and the server says so in
    one line; a TURN URL with none stops `hotplate serve` at once. A player that can
    reach nothing but the TURN server (ICE's relay policy: it offers only its relay
    candidate) gets its pictures through coturn, which says how many bytes it relayed.
    (A player that may use any candidate takes the host pair on loopback.)"""
    world = make_world(tmp_path / "world")
    secret = tmp_path / "turn.txt"
    secret.write_text("hot:plate-secret\n")
    env = {k: v for k, v in os.environ.items() if k != TURN_ENV}
    with Coturn(tmp_path / "turn", "hot", "plate-secret") as turn:
        cmd = invocation(world / "personas", world / "cache", "serve")
        r = subprocess.run(
            [*cmd, "--ice-server", turn.url], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2, r.stderr
        assert f"--ice-server {turn.url}: a TURN server needs a username and password" in r.stderr

        async def session(srv: Server) -> list[str]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
                s = (await c.post("/v1/sessions", json=ASTRO)).json()
                peer = WhepPeer()
                answer = await peer.connect(c, s["whep"])
                assert answer.status_code == 201, answer.text
                await asyncio.wait_for(peer.received.first_video.wait(), 30)
                assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
                await peer.close()
            return [x for x in answer.text.splitlines() if x.startswith("a=candidate")]

        async def relayed(srv: Server) -> tuple[list[str], int]:
            """A player that can reach nothing but the TURN server: every packet both
            ways goes through coturn."""
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
                s = (await c.post("/v1/sessions", json=ASTRO)).json()
                peer = WhepPeer(relay=(turn.url, "hot", "plate-secret"))
                answer = await peer.connect(c, s["whep"])
                assert answer.status_code == 201, answer.text
                offered = peer.pc.localDescription.sdp.splitlines()
                await asyncio.wait_for(peer.received.first_video.wait(), 60)
                got = len(peer.received.video)
                await until(
                    lambda: len(peer.received.video) >= got + 50, 60, "2 s more of pictures"
                )
                # the session's ICE knows this player by its relay candidate only
                ice = (await c.get(f"/v1/sessions/{s['id']}")).json()["ice"]
                assert set(ice["remote_candidates"]) == {"relay"}, ice
                assert ice["selected"] == "relay", ice
                assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
                await peer.close()
            return [x for x in offered if x.startswith("a=candidate")], len(peer.received.video)

        args = ("--workers", "1", "--ice-server", turn.url)
        with Server(world, *args, "--turn-credentials-file", str(secret), env=ENV) as srv:
            precompiled(srv)
            candidates = asyncio.run(session(srv))
            offered, pictures = asyncio.run(relayed(srv))
        assert offered and all(" typ relay " in x for x in offered), offered
        assert pictures >= 50
        # coturn logs what each allocation relayed when it is deleted: the pictures' bytes
        usage = re.compile(r"peer usage: realm=<hotplate>, username=<hot>, .*, sb=(\d+)")

        def relayed_bytes() -> int:
            return max((int(m[1]) for m in usage.finditer(turn.log_text())), default=0)

        asyncio.run(until(lambda: relayed_bytes() >= RELAYED, 60, "coturn's log of the relay"))
        assert relayed_bytes() >= RELAYED, turn.log_text()[-3000:]
        relay = [x for x in candidates if " typ relay " in x]
        assert relay and all(" 127.0.0.1 " in x for x in relay), candidates
        assert re.search(
            r"realm <hotplate> user <hot>: incoming packet ALLOCATE processed, success",
            turn.log_text(),
        )

        with Server(world, *args, env={**ENV, TURN_ENV: "hot:wrong"}) as srv:
            candidates = asyncio.run(session(srv))
            lines = [x for x in srv.log_text().splitlines() if "no relay candidate" in x]
        assert candidates and not any(" typ relay " in x for x in candidates)
        assert len(lines) == 1 and turn.url in lines[0] and "refused the credentials" in lines[0]
        assert "user hot credentials are incorrect" in turn.log_text()
