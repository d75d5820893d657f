"""What every hotplate worker process does, the watcher's (watcher/worker.py) and the
server's (hotplate/serve/workers.py): die with its parent, read its pipe until told to
stop, and report an exception as one line."""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Iterator
from typing import Any


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
