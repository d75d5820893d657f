"""What every hotplate worker process does, the watcher's (watcher/worker.py) and the
server's (hotplate/serve/workers.py).

The parent `spawn`s it (never fork: LMDB and torch must be opened fresh) with one end
of a duplex pipe. The child first calls `enter(parent)`: it dies with its parent
(PR_SET_PDEATHSIG), leaves Ctrl-C to the parent, and returns False when the parent is
gone already. It then reads `messages(conn)` until told to stop, and reports an
exception as `one_line(exc)`.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any


def spawn(target: Callable[..., None], args: tuple, name: str) -> tuple[Any, Any]:
    """(process, the parent's end of its pipe): `target(child_conn, os.getpid(), *args)` in
    a spawned daemon process; the parent's copy of the child's end is closed."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    process = ctx.Process(target=target, args=(child, os.getpid(), *args), name=name, daemon=True)
    process.start()
    child.close()
    return process, parent


def enter(parent: int) -> bool:
    """The first thing a worker does; False when its parent died before it could ask to die
    with it (then the worker returns at once)."""
    die_with_parent()
    if os.getppid() != parent:
        return False
    # Ctrl-C reaches the whole process group; the parent decides what stops, not the worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return True


def die_with_parent() -> None:
    """Linux: get SIGKILL when the daemon dies (kill -9 included), so no orphan keeps
    precompiling into the store. Elsewhere the closed pipe ends the worker after its job."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def messages(conn: Any) -> Iterator[Any]:
    """Each message from the parent, until it sends None or the pipe closes."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        yield msg


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or repr(exc)
    return f"{type(exc).__name__}: {text}"[:500]
