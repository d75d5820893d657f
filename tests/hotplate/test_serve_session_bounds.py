"""What a conversation session holds stays bounded whatever its client does (issue 64),
on a real `hotplate serve` played by real aiortc peers on loopback: a video-only peer
queues no sound; two offers at once get one peer; switches leave one lease; trickled
candidates are capped and none names an address no peer is at."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from cachestore.leases import live_leases
from hotplate.serve.limits import MAX_TRICKLED_CANDIDATES
from hotplate.serve.rtc import AUDIO_QUEUE
from testkit.serve_helpers import Server, assert_problem, make_world, precompiled, speak
from testkit.webrtc_peer import WhepPeer

pytestmark = pytest.mark.slow
ASTRO = {"persona": "astro", "attire": "studio"}
ENV = {"HOTPLATE_SESSION_ICE_TIMEOUT": "5", "HOTPLATE_SESSION_OFFER_TIMEOUT": "30"}
FRAGMENT = "application/trickle-ice-sdpfrag"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("bounds"), attires=("studio", "evening"))


@pytest.fixture(scope="module")
def server(world):
    with Server(world, "--workers", "2", "--max-sessions", "2", env=ENV) as srv:
        srv.avatars = {"studio": precompiled(srv), "evening": precompiled(srv, "evening")}
        yield srv


class VideoOnlyPeer(WhepPeer):
    """A player that offers to receive video and nothing else (no audio m-line)."""

    def __init__(self) -> None:
        from aiortc import RTCConfiguration, RTCPeerConnection

        from hotplate.serve.rtc import configure_ice
        from testkit.webrtc_peer import Received

        configure_ice(["127.0.0.1"])
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.received, self.tasks, self.channel = Received(), [], None
        self.pc.addTransceiver("video", direction="recvonly")
        self.pc.on("track", self._on_track)


async def until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.1)


def pcm(seconds: float, rate: int = 24000) -> bytes:
    from hotplate.demo_data import make_speech_audio

    return (make_speech_audio(seconds, rate) * 32767).astype("<i2").tobytes()


async def figures(c: httpx.AsyncClient, sid: str) -> dict:
    r = await c.get(f"/v1/sessions/{sid}")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_video_only_peer_queues_no_sound(server):
    """Unread sound piled up at 50 pieces a second (402 after 8 s): a peer that takes no
    sound gets none queued, and its pictures stay bounded too."""

    async def run() -> dict:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            peer = VideoOnlyPeer()
            assert (await peer.connect(c, s["whep"])).status_code == 201
            await asyncio.wait_for(peer.received.first_video.wait(), 30)
            ws = await speak(server.url, s, pcm(4.0))  # speech: the sound is not silence

            async def played() -> bool:  # 4 s of frames (100) after the first
                return (await figures(c, s["id"]))["frames"] >= 100

            await until(played, 60, "4 s of frames")
            got = await figures(c, s["id"])
            await ws.close()
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            await peer.close()
            return got

    got = asyncio.run(run())
    assert got["speaking_frames"] > 0, got
    assert got["queued_audio_peak"] == 0 and got["queued_audio_frames"] == 0, got
    assert got["queued_video_frames"] <= 3, got


def test_a_peer_that_takes_sound_queues_a_bounded_amount(server):
    async def run() -> dict:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            peer = WhepPeer()
            assert (await peer.connect(c, s["whep"])).status_code == 201
            await asyncio.wait_for(peer.received.first_video.wait(), 30)

            async def played() -> bool:
                return (await figures(c, s["id"]))["frames"] >= 50

            await until(played, 60, "2 s of frames")
            got = await figures(c, s["id"])
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            await peer.close()
            return got

    got = asyncio.run(run())
    print(f"sound queued at most {got['queued_audio_peak']} pieces in {got['frames']} frames")
    assert 0 < got["queued_audio_peak"] <= AUDIO_QUEUE, got


def test_two_offers_at_once_get_one_peer(server):
    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            peers = [WhepPeer(), WhepPeer()]
            answers = await asyncio.gather(*(p.connect(c, s["whep"]) for p in peers))
            codes = sorted(r.status_code for r in answers)
            assert codes == [201, 409], [r.text for r in answers]
            refused = next(r for r in answers if r.status_code == 409)
            assert_problem(refused, 409, "has its peer already")
            winner = peers[[r.status_code for r in answers].index(201)]
            await asyncio.wait_for(winner.received.first_video.wait(), 30)
            assert (await figures(c, s["id"]))["connected"]
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            for p in peers:
                await p.close()
            # its worker serves the next sessions: two fit again, each with its peer
            made = [(await c.post("/v1/sessions", json=ASTRO)) for _ in range(2)]
            assert [r.status_code for r in made] == [201, 201], [r.text for r in made]
            for r in made:
                assert (await c.delete(f"/v1/sessions/{r.json()['id']}")).status_code == 204

    asyncio.run(run())


def leased_avatars(server) -> list[str]:
    """The avatar keys the store's live leases name (one per lease of an avatar)."""
    avatars = set(server.avatars.values())
    found = live_leases(server.root / "cache", clean=False)
    return sorted(k for lease in found for k in lease.keys if k in avatars)


def test_switches_release_the_avatar_they_leave(server):
    """Each switch leased the new avatar and kept every earlier lease to the session's
    end; now the one it leaves is released once the new one plays, and switches sent at
    once run one after another."""

    async def run() -> tuple[list[str], list[str], dict]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            peer = WhepPeer()
            assert (await peer.connect(c, s["whep"])).status_code == 201
            await asyncio.wait_for(peer.received.first_video.wait(), 30)
            at_start = leased_avatars(server)
            url = f"/v1/sessions/{s['id']}/switch"
            for attire in ("evening", "studio", "evening", "studio"):
                r = await c.post(url, json={"attire": attire})
                assert r.status_code == 204, r.text
            together = await asyncio.gather(
                *(c.post(url, json={"attire": "evening"}) for _ in range(4))
            )
            assert [r.status_code for r in together] == [204] * 4, [r.text for r in together]
            evening = server.avatars["evening"]

            async def settled() -> bool:
                return leased_avatars(server) == [evening]

            await until(settled, 30, "the leases to come down to evening's alone")
            got = await figures(c, s["id"])
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            await peer.close()

            async def none() -> bool:
                return not leased_avatars(server)

            await until(none, 20, "no lease once the session ended")
            return at_start, leased_avatars(server), got

    at_start, after, got = asyncio.run(run())
    assert at_start == [server.avatars["studio"]], at_start
    assert got["leases"] == 1, got


def test_trickled_candidates_are_capped_and_sensible(server):
    def fragment(*addresses: str, port: int = 40000) -> str:
        lines = ["a=mid:0"]
        for k, address in enumerate(addresses):
            lines.append(f"a=candidate:{k} 1 udp 2130706431 {address} {port + k} typ host")
        return "\r\n".join(lines) + "\r\n"

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            peer = WhepPeer()
            r = await peer.connect(c, s["whep"], candidates="none")
            assert r.status_code == 201, r.text
            location, headers = r.headers["location"], {"content-type": FRAGMENT}
            await asyncio.wait_for(peer.received.first_video.wait(), 30)

            async def patch(text: str) -> httpx.Response:
                return await c.patch(location, content=text, headers=headers)

            for address, kind in (
                ("224.0.0.251", "multicast"),
                ("ff02::1", "multicast"),
                ("0.0.0.0", "unspecified"),
                ("::", "unspecified"),
                ("255.255.255.255", "broadcast"),
            ):
                assert_problem(await patch(fragment("127.0.0.1", address)), 400, kind)
            assert (await figures(c, s["id"]))["ice"]["trickled"] == 0  # none of them
            # the cap is per peer, over every PATCH (the route caps each PATCH as well)
            for k in range(MAX_TRICKLED_CANDIDATES // 16 - 1):
                added = await patch(fragment(*["127.0.0.1"] * 16, port=40000 + 16 * k))
                assert added.status_code == 204, added.text
            last = 40000 + MAX_TRICKLED_CANDIDATES
            assert (await patch(fragment(*["127.0.0.1"] * 15, port=last))).status_code == 204
            assert_problem(await patch(fragment("10.1.2.3", "10.1.2.4")), 400, "room for 1")
            assert (await figures(c, s["id"]))["ice"]["trickled"] == MAX_TRICKLED_CANDIDATES - 1
            assert (await patch(fragment("10.1.2.3", port=50000))).status_code == 204
            assert_problem(await patch(fragment("127.0.0.1", port=50001)), 400, "room for 0")
            assert (await figures(c, s["id"]))["ice"]["trickled"] == MAX_TRICKLED_CANDIDATES
            now = time.monotonic()

            async def playing() -> bool:  # the session played on throughout
                return any(t > now for t, _ in peer.received.video)

            await until(playing, 10, "video")
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            await peer.close()

            # an offer naming such an address is refused whole (a malformed offer)
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            offerer = WhepPeer()
            sdp = await offerer.offer()
            mid = next(x for x in sdp.splitlines() if x.startswith("a=mid:"))
            bad = sdp.replace(mid, f"{mid}\r\na=candidate:9 1 udp 1 224.0.0.251 5353 typ host", 1)
            r = await c.post(s["whep"], content=bad, headers={"content-type": "application/sdp"})
            assert_problem(r, 400, "multicast")
            await offerer.close()

    asyncio.run(run())
