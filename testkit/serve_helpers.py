"""A real `hotplate serve` in a subprocess on 127.0.0.1 and a free port, and small
generated personas for it (shared by tests/hotplate/test_serve_*.py and bench_serve)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio, write_loop_video, write_still, write_wav

SIZE = (270, 480)
READY_TIMEOUT = 180.0  # workers spawn and import torch on a busy 2-core machine


def make_world(root: Path, attires: tuple[str, ...] = ("studio",), n_frames: int = 8) -> Path:
    """personas/astro with one loop per attire (each its own content: a seed apiece)
    and a still portrait."""
    folder = root / "personas" / "astro"
    folder.mkdir(parents=True, exist_ok=True)
    for seed, attire in enumerate(attires):
        write_loop_video(folder / f"{attire}.mp4", n_frames=n_frames, size=SIZE, seed=seed)
    write_still(folder / "portrait.png", size=SIZE)
    return root


def speech(path: Path, seconds: float, seed: int = 0) -> Path:
    return write_wav(path, make_speech_audio(seconds, seed=seed), 16000)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m hotplate.cli ... serve` with its log in root/serve-<port>.log."""

    def __init__(self, root: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.root, self.args, self.port = root, args, free_port()
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        self.log = open(self.root / f"serve-{self.port}.log", "wb")
        cmd = invocation(self.root / "personas", self.root / "cache", "serve")
        cmd += ["--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, *self.args], cwd=self.root, env=self.env, stdout=self.log, stderr=self.log
        )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.log_text()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not ready in {READY_TIMEOUT} s: {self.log_text()}")

    def log_text(self, tail: int | None = 3000) -> str:
        """The server's log: its last `tail` characters (None: all of it)."""
        text = (self.root / f"serve-{self.port}.log").read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 300.0), **kw)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.log.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def worker_pids(server_pid: int) -> list[int]:
    """The server's render worker processes (spawned by multiprocessing), from /proc:
    /readyz is open to anyone, so it names no pid."""
    pids = []
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmdline:
                pids.append(int(pid))
    return pids


def wait_state(client: httpx.Client, job_id: str, states: tuple[str, ...], timeout=300.0) -> dict:
    """Poll a job until its state is one of `states` (generous timeout, no fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/renders/{job_id}").json()
        if job["state"] in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {states}: {job}")


def post_render(
    client: httpx.Client, route: str, wav: Path, headers: dict | None = None, **fields: str
):
    """POST persona/attire/... and the audio file as multipart to route."""
    data = {"persona": "astro", "attire": "studio", **fields}
    with open(wav, "rb") as f:
        return client.post(
            route, data=data, files={"audio": (wav.name, f, "audio/wav")}, headers=headers
        )


def mp4_facts(data: bytes, path: Path) -> dict:
    """Codecs and duration of an MP4 given as bytes (written to path, then decoded)."""
    import av

    path.write_bytes(data)
    with av.open(str(path)) as c:
        video, audio = c.streams.video[0], c.streams.audio[0]
        frames = sum(1 for _ in c.decode(video))
        return {
            "video": video.codec_context.name,
            "audio": audio.codec_context.name,
            "frames": frames,
            "seconds": frames / float(video.average_rate),
        }


def assert_problem(response: httpx.Response, status: int, *words: str) -> dict:
    """An RFC 9457 body with this status, one line, no traceback, naming `words`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["title"]
    assert "Traceback" not in response.text and "\n" not in body["detail"]
    for word in words:
        assert word in body["detail"], body["detail"]
    return body


def store_counters(cache: Path) -> dict:
    """The store's counters (hits, misses), read from another process's view of it."""
    from cachestore.stats import store_stats
    from cachestore.store import open_store

    return store_stats(open_store(cache, readonly=True)).counters


def precompiled(srv: Server, attire: str = "studio") -> str:
    """astro in `attire`, precompiled through `srv`: its avatar key."""
    with srv.client() as c:
        job = c.post("/v1/precompile", data={"persona": "astro", "attire": attire}).json()
        done = wait_state(c, job["id"], ("done", "failed"))
    assert done["state"] == "done", done
    return done["avatar"]


async def speak(url: str, session: dict, data: bytes, rate: int = 24000, end: bool = True):
    """The speech WebSocket of `session` on `url`, opened and sent `data` (s16le mono at
    `rate`) in 9600-byte messages (200 ms at 24 kHz), then end_of_turn if `end`; still
    open."""
    import websockets

    ws = await websockets.connect(url.replace("http", "ws", 1) + session["speech"])
    await ws.send(json.dumps({"sample_rate": rate, "channels": 1, "format": "s16le"}))
    for at in range(0, len(data), 9600):
        await ws.send(data[at : at + 9600])
    if end:
        await ws.send(json.dumps({"type": "end_of_turn"}))
    return ws
