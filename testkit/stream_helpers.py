"""Clients of the streaming routes for tests and bench_stream: an incremental reader of
a fragmented MP4 response, and a WebSocket live client sending real-time-paced PCM."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hotplate.serve.stream_jobs import fragment_samples


class Boxes:
    """Top-level MP4 boxes out of a byte stream fed in arbitrary chunks."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        self.buf += data
        while len(self.buf) >= 8:
            size, kind = struct.unpack(">I4s", self.buf[:8])
            if size == 1:
                if len(self.buf) < 16:
                    return
                size = struct.unpack(">Q", self.buf[8:16])[0]
            if size < 8:
                raise AssertionError(f"bad box size {size} ({kind!r})")
            if len(self.buf) < size:
                return
            box = bytes(self.buf[:size])
            del self.buf[:size]
            yield kind.decode("latin-1"), box


def pcm16(samples: np.ndarray, channels: int = 1) -> bytes:
    """float32 mono -> s16le interleaved bytes (the same signal on every channel)."""
    s = np.clip(np.asarray(samples, np.float32), -1, 1)
    pcm = (s * 32767).astype("<i2")
    return np.repeat(pcm[:, None], channels, axis=1).tobytes()


def decode_facts(data: bytes, path: Path) -> dict:
    """Frames, size, keyframe positions and stream durations of a (fragmented) MP4."""
    import av

    path.write_bytes(data)
    with av.open(str(path)) as c:
        frames = list(c.decode(c.streams.video[0]))
        size = (frames[0].width, frames[0].height) if frames else None
    with av.open(str(path)) as c:
        v = c.streams.video[0]
        # read here: a stream is not readable once its container closed (PyAV >= 18.1.1)
        fps = float(v.average_rate or v.guessed_rate or 25)
        keys, spans = [], {"video": [None, 0.0], "audio": [None, 0.0]}
        n = 0
        for p in c.demux():
            if p.pts is None:
                continue
            kind = p.stream.type
            start, end = float(p.pts * p.time_base), float((p.pts + p.duration) * p.time_base)
            span = spans[kind]
            span[0] = start if span[0] is None else min(span[0], start)
            span[1] = max(span[1], end)
            if kind == "video":
                if p.is_keyframe:
                    keys.append(n)
                n += 1
    return {
        "frames": len(frames),
        "size": size,
        "keyframes": keys,
        "video_seconds": spans["video"][1] - spans["video"][0],
        "audio_seconds": spans["audio"][1] - (spans["audio"][0] or 0.0),
        "fps": fps,
    }


@dataclass
class LiveResult:
    init: bytes = b""
    fragments: list[bytes] = field(default_factory=list)
    final: dict | None = None
    close_code: int | None = None
    sent_all_at: float | None = None  # perf_counter when the last PCM chunk went
    end_sent_at: float | None = None
    first_audio_at: float | None = None
    arrivals: list[float] = field(default_factory=list)  # perf_counter per fragment
    fragments_before_end: int = 0

    @property
    def data(self) -> bytes:
        return self.init + b"".join(self.fragments)

    @property
    def frames(self) -> int:
        return sum(fragment_samples(f) for f in self.fragments)


def live_session(
    url: str,
    start: dict,
    pcm: bytes,
    bytes_per_second: int,
    chunk_seconds: float = 0.1,
    realtime: bool = True,
    end: bool = True,
    timeout: float = 300.0,
) -> LiveResult:
    """One /v1/live session: the start message, `pcm` in chunks (paced at real time when
    `realtime`), the end message; fragments are read on a thread while it sends."""
    from websockets.exceptions import ConnectionClosed

    out = LiveResult()
    ws = live_connect(url)

    def reader() -> None:
        try:
            while True:
                msg = ws.recv(timeout=timeout)
                if isinstance(msg, bytes):
                    if msg[4:8] == b"ftyp":
                        out.init = msg
                    else:
                        out.fragments.append(msg)
                        out.arrivals.append(time.perf_counter())
                        if out.end_sent_at is None:
                            out.fragments_before_end += 1
                else:
                    out.final = json.loads(msg)
        except ConnectionClosed as exc:
            out.close_code = exc.rcvd.code if exc.rcvd else None
        except TimeoutError:
            pass

    thread = threading.Thread(target=reader, daemon=True)
    try:
        ws.send(json.dumps(start))
        thread.start()
        step = max(2, int(bytes_per_second * chunk_seconds) // 2 * 2)
        t0 = time.perf_counter()
        try:
            for k, i in enumerate(range(0, len(pcm), step)):
                if realtime:  # pace: chunk k leaves when its audio would have been spoken
                    delay = t0 + k * chunk_seconds - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                ws.send(pcm[i : i + step])
                if out.first_audio_at is None:
                    out.first_audio_at = time.perf_counter()
            out.sent_all_at = time.perf_counter()
            if end:
                ws.send(json.dumps({"type": "end"}))
                out.end_sent_at = time.perf_counter()
        except ConnectionClosed:
            pass
        thread.join(timeout)
    finally:
        ws.close()
    return out


def live_connect(url: str, rcvbuf: int | None = None, query: str = ""):
    """A websockets sync client on /v1/live; `rcvbuf` shrinks its socket's receive
    buffer (a client that does not read then fills the server's send path quickly)."""
    from websockets.sync.client import connect

    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    url = f"ws://{host}:{port}/v1/live{query}"
    # no keepalive pings: a test client that reads nothing must not close on its own
    return connect(url, sock=sock, max_size=None, open_timeout=60, ping_interval=None)
