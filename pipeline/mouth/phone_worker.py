"""The phone recogniser in a process of its own, so that a render's threads keep the GIL.

PocketSphinx holds the GIL while it decodes: heard by a thread beside a render, its
~6 % of a core cost the export a fifth of its speed (bench_hot_path's 250-frame
1080x1920 loop: 38.7 fps before the phones, 31.7 with them heard in a thread). Here one
worker per process hears the pieces a render has not reached yet (`visemes.PhoneTrack`);
the piece a render waits on before its first frame is heard where it is (no round trip,
no start-up). The worker is started at its first use, reads requests on its stdin and
ends when that closes, so it goes with its parent however the parent ends (a kill -9
included). Where it cannot start or dies, the piece is heard in this process: slower,
never lost. A forked child starts a worker of its own: its parent's pipes are closed in
it (two processes speaking on one pipe would garble both), and so is any request its
parent had under way.

A request: <sr: u32> <n: u64> then n bytes of float32 mono samples. A reply: <n: u32>
then n bytes of JSON, [[phone, first, last], ...] or {"error": "..."}.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from pipeline.mouth.recogniser import hear

_lock = threading.Lock()  # one request at a time: the worker hears one utterance at a time
_worker: subprocess.Popen | None = None
_broken = False  # it failed once in this process: hear here from then on
_inherited: list[subprocess.Popen] = []  # a forked child's copy of its parent's worker
# How long a reply may take: a stalled worker (stopped, swapping, wedged: not dead, so its
# pipe never closes) would otherwise hold the process-wide lock and every render that
# needs phones. PocketSphinx hears a second of speech in well under 0.1 s of a core, so
# this leaves a loaded machine tens of times that before the worker is given up.
REPLY_WITHIN = 10.0  # seconds, plus REPLY_PER_SECOND for each second of the piece
REPLY_PER_SECOND = 1.0
_REQUEST = struct.Struct("<IQ")
_REPLY = struct.Struct("<I")


def _start() -> subprocess.Popen | None:
    """The worker, started now; None (and said once on stderr) where it cannot start."""
    global _broken
    root = str(Path(__file__).resolve().parents[2])  # the checkout or site-packages
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        return subprocess.Popen(
            [sys.executable, "-c", "from pipeline.mouth.phone_worker import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
    except OSError as e:
        _broken = True
        print(
            f"hotplate: the phone worker did not start ({e}); hearing in process", file=sys.stderr
        )
        return None


def _after_fork_in_child() -> None:
    """In a forked child: forget the parent's worker and its lock (held, maybe, by a
    parent's thread that does not exist here), and close this copy of its pipes, so the
    worker still ends when its parent closes them."""
    global _lock, _worker
    _lock = threading.Lock()
    if _worker is not None:
        for stream in (_worker.stdin, _worker.stdout):
            try:
                os.close(stream.fileno())
            except (OSError, ValueError):
                pass
        # kept, never collected: collecting it would close those fd numbers again, and
        # by then they may be some other file's in this process
        _inherited.append(_worker)
        _worker = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def warm() -> None:
    """Start the worker now, if it is not running (a render worker, before its first job)."""
    global _worker
    with _lock:
        if _worker is None and not _broken:
            _worker = _start()


def worker_pid() -> int | None:
    """The running worker's pid, or None (for the tests, which kill it and fork)."""
    with _lock:
        return None if _worker is None or _worker.poll() is not None else _worker.pid


def _ask(proc: subprocess.Popen, samples: np.ndarray, sr: int) -> list[tuple[str, int, int]]:
    data = np.ascontiguousarray(samples, np.float32).tobytes()
    proc.stdin.write(_REQUEST.pack(sr, len(data)) + data)
    proc.stdin.flush()
    head = proc.stdout.read(_REPLY.size)
    if len(head) < _REPLY.size:
        raise EOFError(f"the phone worker exited (code {proc.poll()})")
    (n,) = _REPLY.unpack(head)
    got = json.loads(proc.stdout.read(n))
    if isinstance(got, dict):
        raise RuntimeError(got["error"])
    return [(str(p), int(a), int(b)) for p, a, b in got]


def _ask_within(
    proc: subprocess.Popen, samples: np.ndarray, sr: int, seconds: float
) -> list[tuple[str, int, int]]:
    """`_ask`, given up after `seconds`: the worker is killed (its pipes close, so the
    thread blocked on them ends) and TimeoutError raised."""
    box: dict = {}

    def ask() -> None:
        try:
            box["got"] = _ask(proc, samples, sr)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=ask, name="phone-ask", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        proc.kill()  # SIGKILL ends a stopped process too
        thread.join()
        raise TimeoutError(f"no answer in {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["got"]


def hear_apart(samples: np.ndarray, sr: int) -> list[tuple[str, int, int]]:
    """`recogniser.hear(samples, sr)`, heard by the worker (this thread waits on a pipe,
    the GIL free); in this process where the worker cannot run."""
    global _worker, _broken
    with _lock:
        if _worker is None and not _broken:
            _worker = _start()
        if _worker is not None:
            within = REPLY_WITHIN + REPLY_PER_SECOND * len(samples) / sr
            try:
                return _ask_within(_worker, samples, sr, within)
            except (OSError, ValueError, EOFError, TimeoutError) as e:
                # a worker that died, stalled or spoke nonsense: not trusted again here
                print(
                    f"hotplate: the phone worker failed ({e}); hearing in process", file=sys.stderr
                )
                _worker.kill()
                _worker.wait()
                _worker, _broken = None, True
    return hear(samples, sr)


def _read(stream, n: int) -> bytes | None:
    out = b""
    while len(out) < n:
        got = stream.read(n - len(out))
        if not got:
            return None
        out += got
    return out


def serve() -> None:
    """The worker's loop: hear each request until stdin closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (head := _read(stdin, _REQUEST.size)) is not None:
        sr, n = _REQUEST.unpack(head)
        data = _read(stdin, n)
        if data is None:
            return
        try:
            reply: object = hear(np.frombuffer(data, np.float32), sr)
        except Exception as e:  # the parent raises it where the render waits
            reply = {"error": f"{type(e).__name__}: {e}"}
        body = json.dumps(reply).encode()
        stdout.write(_REPLY.pack(len(body)) + body)
        stdout.flush()
