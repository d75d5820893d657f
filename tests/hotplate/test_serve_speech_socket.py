"""A conversation session's speech socket bounded (issue 64), on a real `hotplate serve`
with real sessions (a worker each, aiortc in it) and real `websockets` clients: one socket
per session, an idle limit, the session's end closing it, speech past the worker's queue
said to the client, malformed and oversized messages closed with a documented code and a
one-line reason, and a seeded fuzz of hostile first messages and frames after which a
normal session still plays.

It needs the webrtc extra in the server (a session needs aiortc), so it is not in the
quick tier. Every wait is on an event (a close frame, a 404) with a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import httpx
import pytest

from hotplate.demo_data import make_speech_audio
from hotplate.serve.limits import MAX_PCM_MESSAGE, MAX_TEXT_MESSAGE
from hotplate.serve.speech import CLOSE_CODES, ENDED, IDLE, REPLACED
from testkit.serve_helpers import Server, make_world, precompiled
from testkit.speech_fuzz import FORMAT, closed, describe, hostile, run_case
from testkit.webrtc_peer import WhepPeer

pytestmark = pytest.mark.slow
ASTRO = {"persona": "astro", "attire": "studio"}
IDLE_S = 3.0  # HOTPLATE_SPEECH_IDLE_TIMEOUT for this server
# HOTPLATE_SPEECH_QUEUE_SECONDS: the worker's queue of speech, small enough to reach inside
# the pace (60 s ahead of the wall clock) without a minute of sending
QUEUE_S = 3.0
ENV = {
    "HOTPLATE_SESSION_ICE_TIMEOUT": "5",
    "HOTPLATE_SESSION_OFFER_TIMEOUT": "600",  # sessions here live without a peer
    "HOTPLATE_SPEECH_IDLE_TIMEOUT": str(IDLE_S),
    "HOTPLATE_SPEECH_QUEUE_SECONDS": str(QUEUE_S),
}
FUZZ_CASES = 120  # seconds in all: each is one socket on loopback


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("speech"))
    with Server(root, "--workers", "2", "--max-sessions", "2", env=ENV) as srv:
        precompiled(srv)
        yield srv


def pcm(seconds: float, rate: int = 16000) -> bytes:
    return (make_speech_audio(seconds, rate, 0) * 32767).astype("<i2").tobytes()


def ws_url(srv: Server, session: dict) -> str:
    return srv.url.replace("http", "ws", 1) + session["speech"]


async def open_speech(srv: Server, session: dict):
    import websockets

    ws = await websockets.connect(ws_url(srv, session), max_size=None)
    await ws.send(FORMAT)
    return ws


async def alive(srv: Server, session: dict) -> None:
    """The session takes a socket and a message: a bogus one gets its 1003 and reason."""
    async with await open_speech(srv, session) as ws:
        await ws.send(pcm(0.1))
        await ws.send(json.dumps({"type": "bogus"}))
        code, reason = await closed(ws)
    assert code == 1003 and "end_of_turn" in reason, (code, reason)


def test_a_newer_speech_socket_replaces_the_older_with_4409(server):
    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            sockets = []
            for _ in range(20):  # the 20 sockets on one session
                sockets.append(await open_speech(server, s))
            for ws in sockets[:-1]:
                code, reason = await closed(ws)
                assert code == REPLACED and "newer" in reason, (code, reason)
            last = sockets[-1]
            await last.send(pcm(0.1))
            await last.send(json.dumps({"type": "end_of_turn"}))
            await last.send(json.dumps({"type": "bogus"}))  # still the session's: answered
            assert (await closed(last))[0] == 1003
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204

    asyncio.run(run())


def test_an_idle_speech_socket_is_closed_with_4408_and_a_reason(server):
    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            ws = await open_speech(server, s)
            await ws.send(pcm(0.1))
            code, reason = await closed(ws, IDLE_S + 20)
            assert code == IDLE and f"{IDLE_S:g} s" in reason, (code, reason)
            await alive(server, s)  # the session outlives its socket
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204

    asyncio.run(run())


def test_the_sessions_end_closes_its_speech_socket_within_a_second(server):
    """DELETE of the session, and a session its worker ends (a malformed offer): the
    socket gets 4410 and the reason, by the time the DELETE is answered or a second after
    the session is gone."""

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            ws = await open_speech(server, s)
            await ws.send(pcm(0.1))
            watch = asyncio.ensure_future(closed(ws))
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            answered = time.monotonic()
            code, reason = await asyncio.wait_for(watch, 20)
            late = time.monotonic() - answered
            assert code == ENDED and "ended by DELETE" in reason, (code, reason)
            # its cause, not its time, is asserted (a busy 2-core machine may take longer than
            # the second docs/serving.md gives): ENDED, not the idle limit's close
            print(f"the socket closed {late:.2f} s after the DELETE's answer")

            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            ws = await open_speech(server, s)
            watch = asyncio.ensure_future(closed(ws))
            bad = await c.post(s["whep"], content=b"v=0\r\nno SDP", headers=SDP)
            assert bad.status_code == 400, bad.text
            code, reason = await asyncio.wait_for(watch, 20)
            assert code == ENDED and "malformed offer" in reason, (code, reason)
            gone = await c.get(f"/v1/sessions/{s['id']}")
            assert gone.status_code == 404, gone.text

    asyncio.run(run())


SDP = {"content-type": "application/sdp"}


async def refused_past(c: httpx.AsyncClient, sid: str, seconds: float) -> dict:
    """The session's figures once its worker has refused more than `seconds` of speech in
    all (the refusal event precedes the stats answer on the control channel, so the
    server holds it by then); 20 s at most."""
    deadline = time.monotonic() + 20
    while True:
        figures = (await c.get(f"/v1/sessions/{sid}")).json()
        if figures["refused_speech_seconds"] > seconds:
            return figures
        assert time.monotonic() < deadline, f"no speech refused past {seconds} s: {figures}"
        await asyncio.sleep(0.1)


def test_speech_the_worker_refuses_is_said_to_the_client_and_the_session_lives(server):
    """Speech past the worker's queue (no peer here: nothing plays, so all of it stays
    queued) is refused there; the server says the worker's one line to the client's next
    speech: a 1008 close on the socket, a 429 to a POST, once. The session lives on and,
    after an interrupt, takes speech again. (The server dropped the worker's event: the
    socket took speech on and on, refused unseen.)"""
    over = pcm(QUEUE_S + 1)  # more than the queue holds: refused whole

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            post = f"/v1/sessions/{s['id']}/speech?sample_rate=16000"
            ws = await open_speech(server, s)
            await ws.send(over)
            figures = await refused_past(c, s["id"], 0)
            line = figures["refused_speech"]
            assert f"over {QUEUE_S:g} s of speech queued" in line and "\n" not in line, line
            await ws.send(pcm(0.1))  # the next speech is told
            said = json.loads(await asyncio.wait_for(ws.recv(), 20))
            assert said == {"type": "error", "code": 1008, "detail": line}, said
            code, reason = await closed(ws)
            assert code == 1008 and reason == line[:120], (code, reason)

            assert (await c.get(f"/v1/sessions/{s['id']}")).status_code == 200
            ws = await open_speech(server, s)
            await ws.send(over)
            figures = await refused_past(c, s["id"], figures["refused_speech_seconds"])
            line = figures["refused_speech"]
            r = await c.post(post, content=pcm(0.1))
            assert r.status_code == 429 and r.json()["detail"] == line, r.text
            r = await c.post(post, content=pcm(0.1))  # said once: this one is taken
            assert r.status_code == 204, r.text

            await ws.send(over)
            await refused_past(c, s["id"], figures["refused_speech_seconds"])
            assert (await c.post(s["interrupt"])).status_code == 204  # forgets the refusal
            await alive(server, s)  # a new socket's speech is taken, its bogus message 1003
            await ws.close()
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
        assert "Traceback" not in server.log_text(tail=None)

    asyncio.run(run())


def test_deep_nesting_and_oversized_messages_close_with_a_reason_and_the_session_lives(server):
    """The issue's 100,000 brackets (over the text limit: 1009), brackets under the limit
    (past Python's recursion limit: 1007), a 9 MB PCM message (uvicorn's limit, 1009):
    each a close frame with a reason; the session takes the next socket."""

    async def case(s: dict, *messages, first: bool = True) -> tuple[int | None, str]:
        import websockets

        async with websockets.connect(ws_url(server, s), max_size=None) as ws:
            if not first:
                await ws.send(FORMAT)
            for message in messages:
                await ws.send(message)
            return await closed(ws)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            code, reason = await case(s, "[" * 100_000)
            assert code == 1009 and str(MAX_TEXT_MESSAGE) in reason, (code, reason)
            code, reason = await case(s, "[" * 3000)
            assert code == 1007 and "JSON object" in reason, (code, reason)
            code, reason = await case(s, '{"sample_rate": ' + "[" * 500 + "]" * 500 + "}")
            assert code == 1007 and "flat" in reason, (code, reason)
            code, reason = await case(s, bytes(9_000_000), first=False)
            assert code == 1009 and reason, (code, reason)
            code, reason = await case(s, bytes(MAX_PCM_MESSAGE + 2), first=False)
            assert code == 1009 and reason, (code, reason)
            assert (await c.get(f"/v1/sessions/{s['id']}")).status_code == 200
            await alive(server, s)
            assert "Traceback" not in server.log_text(tail=None)
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204

    asyncio.run(run())


# -- the fuzz: a seeded generator of hostile first messages and frames -------------------


def test_hostile_first_messages_and_frames_end_in_a_documented_close(server):
    """FUZZ_CASES seeded cases (seed printed): each socket ends in a close frame whose code
    is one of speech.CLOSE_CODES, or, its messages all taken, in the 1003 its last bogus
    message earns; no traceback in the log; then a normal session plays."""
    seed = int(os.environ.get("HOTPLATE_FUZZ_SEED") or random.randrange(1 << 32))
    print(f"speech socket fuzz seed {seed}")
    rng = random.Random(seed)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            seen: dict[int, int] = {}
            for number in range(FUZZ_CASES):
                case = hostile(rng)
                code, reason = await run_case(ws_url(server, s), case)
                what = f"case {number} (seed {seed}): {describe(case)}"
                assert code in CLOSE_CODES | {1007, 1009}, f"{what} -> {code} {reason!r}"
                assert reason and "\n" not in reason, f"{what} -> {code} {reason!r}"
                seen[code] = seen.get(code, 0) + 1
                if code == 1008 and ("ahead" in reason or "refused" in reason):
                    await c.post(s["interrupt"])  # the pace or the queue: start it again
            print(f"close codes seen: {dict(sorted(seen.items()))}")
            assert (await c.get(f"/v1/sessions/{s['id']}")).status_code == 200
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204

            # the server is healthy: a new session plays to a real peer
            s = (await c.post("/v1/sessions", json=ASTRO)).json()
            peer = WhepPeer()
            try:
                assert (await peer.connect(c, s["whep"])).status_code == 201
                await asyncio.wait_for(peer.received.first_video.wait(), 60)
                await alive(server, s)
            finally:
                await c.delete(f"/v1/sessions/{s['id']}")
                await peer.close()
        log = server.log_text(tail=None)
        assert "Traceback" not in log, log[log.index("Traceback") - 300 :][:3000]

    asyncio.run(run())


# -- HTTP bodies: checked before they are read --------------------------------------------


def raw_post(
    srv: Server, path: str, kind: str, declared: int | None, total: int, method: str = "POST"
) -> tuple:
    """POST (or `method`) `total` bytes of `kind` over a raw socket, chunked (or with a declared
    Content-Length and no body when `declared`), reading the answer as it sends:
    (status line and body, bytes sent before the answer came)."""
    import socket
    import threading

    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{srv.port}", f"Content-Type: {kind}"]
    head.append(f"Content-Length: {declared}" if declared else "Transfer-Encoding: chunked")
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    sent, answered = 0, threading.Event()

    def pour() -> None:
        nonlocal sent
        chunk = b"%x\r\n%s\r\n" % (1 << 16, b"a=candidate:x\r\n".ljust(1 << 16, b"x"))
        try:
            while sent < total and not answered.is_set() and declared is None:
                sock.sendall(chunk)
                sent += 1 << 16
        except OSError:
            pass  # the server answered and hung up

    thread = threading.Thread(target=pour, daemon=True)
    thread.start()
    answer = b""
    try:
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            got = sock.recv(65536)
            if not got:
                break
            answer += got
    finally:
        answered.set()
        thread.join(30)
        sock.close()
    return answer.decode(errors="replace"), sent


def test_an_offer_or_a_fragment_over_its_limit_is_413_before_it_is_read(server):
    """50 MB of offer, chunked: 413 naming the 64 KiB limit while it is still being sent
    (the route read up to the 50 MB upload limit first); a declared 10 MB: 413 with no
    byte sent. A PATCH over 16 KiB or with more than 32 candidates: 413, one line."""
    from hotplate.serve.limits import MAX_CANDIDATES_PER_PATCH, MAX_OFFER, MAX_SDPFRAG

    with server.client(timeout=60) as c:
        s = c.post("/v1/sessions", json=ASTRO).json()
        try:
            answer, sent = raw_post(server, s["whep"], "application/sdp", None, 50 << 20)
            assert answer.startswith("HTTP/1.1 413") and f"{MAX_OFFER}-byte" in answer, answer
            assert sent < 20 << 20, f"{sent} bytes went in before the 413"
            answer, sent = raw_post(server, s["whep"], "application/sdp", 10 << 20, 0)
            assert answer.startswith("HTTP/1.1 413") and f"{MAX_OFFER}-byte" in answer, answer

            peer = f"/v1/sessions/{s['id']}/whep/peer"
            frag = "application/trickle-ice-sdpfrag"
            answer, _ = raw_post(server, peer, frag, None, 50 << 20, "PATCH")
            assert answer.startswith("HTTP/1.1 413") and f"{MAX_SDPFRAG}-byte" in answer, answer
            line = "a=candidate:1 1 udp 2130706431 127.0.0.1 {} typ host\r\n"
            many = "a=mid:0\r\n" + "".join(
                line.format(9000 + n) for n in range(MAX_CANDIDATES_PER_PATCH + 1)
            )
            r = c.patch(peer, content=many, headers={"content-type": frag})
            assert r.status_code == 413 and f"at most {MAX_CANDIDATES_PER_PATCH}" in r.text, r.text
            r = c.patch(peer, content="a=candidate:1\r\nx=y\r\n", headers={"content-type": frag})
            assert r.status_code == 400 and "\n" not in r.json()["detail"], r.text
            assert c.get(f"/v1/sessions/{s['id']}").status_code == 200  # it lives on
        finally:
            c.delete(f"/v1/sessions/{s['id']}")
