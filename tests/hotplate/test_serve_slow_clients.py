"""Slow and trickling clients of the streaming routes hold nothing, on a real `hotplate
serve` (uvicorn on loopback, a real render worker): a live session that trickles bytes
or runs past its audio limit is dropped, a stream client that reads nothing is dropped
and its render stopped, and a live session the full queue refuses leaves no job behind.

Every wait is on an event (a close, a job's state) with a bound; none asserts on speed.
"""

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from hotplate.demo_data import make_speech_audio, write_loop_video
from testkit.preconditions import require
from testkit.serve_helpers import Server, make_world, post_render, speech, wait_state
from testkit.stream_helpers import live_connect, pcm16
from tests.hotplate.many_processes import start_holder

pytestmark = pytest.mark.slow
MAX_AUDIO_SECONDS = 8.0
GRACE = 1.0  # HOTPLATE_LIVE_GRACE: a session lasts at most 8 + 1 s
SEND_TIMEOUT = 2.0
RATE = 32000  # bytes per second of 16 kHz mono s16le
START = {"persona": "astro", "attire": "studio", "sample_rate": 16000, "channels": 1}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("slow"), attires=("studio", "held"))
    # a presenter-sized loop: its stream outgrows the loopback socket buffers (~4 MiB)
    write_loop_video(root / "personas" / "astro" / "big.mp4", n_frames=4, size=(1080, 1920))
    speech(root / "one.wav", 1.0)
    speech(root / "eight.wav", MAX_AUDIO_SECONDS - 0.5)
    return root


@pytest.fixture(scope="module")
def server(world):
    args = ["--workers", "1", "--queue-size", "1", "--max-audio-seconds", str(MAX_AUDIO_SECONDS)]
    env = {"HOTPLATE_LIVE_SEND_TIMEOUT": str(SEND_TIMEOUT), "HOTPLATE_LIVE_GRACE": str(GRACE)}
    with Server(world, *args, env=env) as srv:
        with srv.client() as c:  # studio and big hot: the sessions below stream hot
            for attire in ("studio", "big"):
                job = c.post("/v1/precompile", data={"persona": "astro", "attire": attire})
                assert wait_state(c, job.json()["id"], ("done", "failed"))["state"] == "done"
        yield srv


def leftovers(world) -> list[str]:
    data = world / "cache-serve"
    return sorted(p.name for sub in ("uploads", "videos") for p in (data / sub).iterdir())


class Closing:
    """Reads a live socket on a thread until the server closes it: `closed` is set then,
    with the last error message and the close code."""

    def __init__(self, ws) -> None:
        self.ws, self.closed = ws, threading.Event()
        self.error: dict | None = None
        self.code: int | None = None
        self.done = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                msg = self.ws.recv(timeout=300)
                if isinstance(msg, str):
                    body = json.loads(msg)
                    self.error = body if body.get("type") == "error" else self.error
                    self.done = self.done or body.get("type") == "done"
        except ConnectionClosed as exc:
            self.code = exc.rcvd.code if exc.rcvd else None
        except TimeoutError:
            pass
        self.closed.set()


def feed(ws, closing: Closing, chunk: bytes, every: float, total: int, bound: float) -> int:
    """Send `chunk` every `every` seconds (a client's pace, not a test's wait) until the
    server closes, `total` bytes went, or `bound` seconds pass; the bytes sent."""
    from websockets.exceptions import ConnectionClosed

    sent, start = 0, time.monotonic()
    while sent < total and not closing.closed.is_set() and time.monotonic() - start < bound:
        try:
            ws.send(chunk)
        except ConnectionClosed:
            break
        sent += len(chunk)
        closing.closed.wait(every)
    return sent


def last_live_job(server) -> dict:
    with server.client() as c:
        jobs = [j for j in c.get("/v1/renders").json()["renders"] if j["kind"] == "live"]
        return wait_state(c, jobs[0]["id"], ("done", "failed", "cancelled"))


def worker_serves(server) -> None:
    with server.client() as c:
        assert post_render(c, "/v1/lip-sync", server.root / "one.wav").status_code == 200


def test_a_live_client_trickling_bytes_is_dropped(server, world):
    """Two bytes every half second (the attack sent two every 20 s, under the idle
    timeout) would hold the render worker until 8 s of audio came: days."""
    before = leftovers(world)
    with live_connect(server.url) as ws:
        ws.send(json.dumps(START))
        closing = Closing(ws)
        feed(ws, closing, b"\0\0", 0.5, total=1 << 30, bound=120)
        assert closing.closed.wait(30), "the trickling session was never dropped"
    assert closing.code == 1008 and "slower than 0.5x real time" in closing.error["detail"]
    job = last_live_job(server)
    assert job["state"] in ("failed", "cancelled") and "slower than" in job["error"], job
    assert leftovers(world) == before
    worker_serves(server)


def test_a_live_session_ends_at_its_audio_limit_plus_grace(server, world):
    """Speech at 0.6x real time passes the rate check, but 7.9 s of it would take 13 s:
    the session is cut at 8 + 1 s."""
    before = leftovers(world)
    pcm = pcm16(make_speech_audio(MAX_AUDIO_SECONDS - 0.1, sr=16000, seed=5))
    step = RATE // 10  # 0.1 s of audio ...
    with live_connect(server.url) as ws:
        ws.send(json.dumps(START))
        closing = Closing(ws)
        t0 = time.monotonic()
        for i in range(0, len(pcm), step):  # ... every 1/6 s: 0.6x real time
            if closing.closed.is_set():
                break
            try:
                ws.send(pcm[i : i + step])
            except Exception:  # noqa: BLE001 - the server closed it, as it should
                break
            closing.closed.wait(max(0.0, t0 + (i // step + 1) / 6 - time.monotonic()))
        else:
            ws.send(json.dumps({"type": "end"}))
        assert closing.closed.wait(60)
    assert not closing.done, "the session ran past its limit to the end"
    assert closing.code == 1008 and "9 s limit" in closing.error["detail"], closing.error
    assert last_live_job(server)["state"] in ("failed", "cancelled")
    assert leftovers(world) == before
    worker_serves(server)


def test_a_stream_client_that_reads_nothing_is_dropped_and_its_render_stopped(server, world):
    import socket

    before = leftovers(world)
    with open(world / "eight.wav", "rb") as f:
        audio = f.read()
    boundary = "slow-reader"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="persona"\r\n\r\nastro\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="attire"\r\n\r\nbig\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="audio"; filename="e.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + audio
        + f"\r\n--{boundary}--\r\n".encode()
    )
    head = (
        f"POST /v1/lip-sync/stream HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and then read nothing
    sock.connect(("127.0.0.1", server.port))
    try:
        sock.sendall(head + body)
        sock.settimeout(120)
        answer = b""
        while b"\r\n\r\n" not in answer:  # the headers, to learn the job; nothing more
            answer += sock.recv(1)
        job_id = next(
            line.split(b":", 1)[1].strip().decode()
            for line in answer.split(b"\r\n")
            if line.lower().startswith(b"x-hotplate-job:")
        )
        dropped = f"stream {job_id}: the client read nothing for {SEND_TIMEOUT:g} s; dropped"
        deadline = time.monotonic() + 120
        while dropped not in server.log_text():
            assert time.monotonic() < deadline, "the server never dropped the stalled client"
            time.sleep(0.1)
        # the server hung up: what the socket holds ends before the response's last chunk
        sock.settimeout(30)
        rest = b""
        while chunk := sock.recv(1 << 20):
            rest += chunk
        assert rest and not rest.endswith(b"0\r\n\r\n")
    finally:
        sock.close()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        job = wait_state(c, job_id, ("done", "failed", "cancelled"))
    if job["state"] == "cancelled":  # the render was still running: it was stopped
        assert "read nothing" in job["error"], job
        assert leftovers(world) == before  # and its partial video is gone
    else:  # it had finished: a done job is kept, video and all
        assert job["state"] == "done", job
        assert leftovers(world) == sorted([*before, f"{job_id}.mp4"])
    worker_serves(server)


def test_a_live_session_refused_by_a_full_queue_leaves_no_job(server, world):
    """The worker waits on a build another process holds, one job waits in the queue
    (--queue-size 1): a live session then gets 1013 and no job row is made."""
    from websockets.exceptions import ConnectionClosed

    holder = start_holder(world, "held")
    try:
        with server.client() as c:
            first = post_render(c, "/v1/renders", world / "one.wav", attire="held").json()
            wait_state(c, first["id"], ("running",))
            second = post_render(c, "/v1/renders", world / "one.wav", attire="held").json()
            assert second["state"] == "queued"
            before = {j["id"] for j in c.get("/v1/renders").json()["renders"]}
            with live_connect(server.url) as ws:
                try:
                    ws.send(json.dumps(START))
                except ConnectionClosed:  # refused at the handshake (admission), before it
                    pass
                closing = Closing(ws)
                assert closing.closed.wait(60)
            assert closing.code == 1013 and "queue is full" in closing.error["detail"]
            after = {j["id"] for j in c.get("/v1/renders").json()["renders"]}
            assert after == before, "the refused live session left a job record"
            for job in (second, first):
                c.delete(f"/v1/renders/{job['id']}")
            # a cancelled job keeps its queue slot until the worker takes it off
            deadline = time.monotonic() + 120
            while c.get("/readyz").json()["queued"]:
                assert time.monotonic() < deadline, "the queue never emptied"
                time.sleep(0.1)
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert not [n for n in leftovers(world) if n.endswith((".pcm", ".part"))]
    worker_serves(server)


def blocked_on_disk(pid: int) -> bool:
    """Whether a thread of the process sleeps uninterruptibly (state D: a frozen disk)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state == "D":
            return True
    return False


@pytest.fixture
def frozen_uploads(world, tmp_path):
    """A data dir whose uploads/ is an ext4 image of its own (loop-mounted), which the
    test can freeze (fsfreeze): every write there then blocks, as on a stalled disk."""
    import shutil
    import subprocess

    data, image = tmp_path / "data", tmp_path / "uploads.img"
    (data / "uploads").mkdir(parents=True)
    tools = all(shutil.which(t) for t in ("mkfs.ext4", "fsfreeze", "mount"))
    require(tools, "needs mkfs.ext4, fsfreeze and mount (e2fsprogs, util-linux)")
    subprocess.run(["truncate", "-s", "32M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    done = subprocess.run(
        ["mount", "-o", "loop", str(image), str(data / "uploads")], capture_output=True, text=True
    )
    require(
        done.returncode == 0,
        f"cannot loop-mount an ext4 image ({done.stderr.strip()}); run as root",
    )

    def freeze(on: bool) -> None:
        subprocess.run(["fsfreeze", "-f" if on else "-u", str(data / "uploads")], check=True)

    try:
        yield data, freeze
    finally:
        subprocess.run(["fsfreeze", "-u", str(data / "uploads")], capture_output=True)
        subprocess.run(["umount", "-l", str(data / "uploads")], check=True)


def test_a_stalled_disk_under_live_input_blocks_no_other_client(world, frozen_uploads):
    """Live PCM is written off the event loop: while the disk holding it is frozen (a
    write there blocks), the same server still answers another client."""
    data, freeze = frozen_uploads
    args = ("--workers", "1", "--data", str(data), "--max-audio-seconds", str(MAX_AUDIO_SECONDS))
    pcm = pcm16(make_speech_audio(2.0, sr=16000, seed=6))
    with Server(world, *args) as srv, live_connect(srv.url) as ws, srv.client(timeout=20) as c:
        ws.send(json.dumps(START))
        closing = Closing(ws)
        ws.send(pcm[: RATE // 2])
        freeze(True)
        try:
            ws.send(pcm[RATE // 2 : RATE])  # the server's write of this blocks:
            deadline = time.monotonic() + 60
            while not blocked_on_disk(srv.proc.pid):
                assert time.monotonic() < deadline, "the server never wrote the PCM"
                time.sleep(0.05)
            answered = c.get("/healthz")  # ... and the loop still serves others
        finally:
            freeze(False)
        assert answered.status_code == 200
        ws.send(pcm[RATE:])
        ws.send(json.dumps({"type": "end"}))
        assert closing.closed.wait(120)
        assert closing.done and closing.error is None, closing.error
