"""Single flight per avatar key, across processes, as Nix's path locks do it.

A precompile of an avatar holds an exclusive `flock` on `<cache>/locks/<key>.lock` from
its miss to its manifest, and writes who it is into the file (pid, command line, start
time) so that a second caller can say whom it waits for. The kernel drops the lock when
the holder's file descriptor closes, so a holder killed with -9 releases it at once: no
stale lock file to clean. The files stay (a few bytes each, reused by the next build).

flock locks belong to an open file description, so two threads of one process that each
call `single_flight` exclude each other too (the HTTP service's workers).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cachestore.atomic import held
from cachestore.errors import StoreError, StoreNotWritableError

DEFAULT_WAIT = 900.0  # seconds; a long loop's precompile on CPU takes minutes
POLL = (0.01, 0.25)  # first and longest pause between tries while waiting


class FlightTimeoutError(StoreError):
    """Another process held the avatar's lock for longer than the wait limit."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock (or a lease): read from the file it wrote."""

    pid: int
    command: str
    since: float

    def __str__(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} ({self.command}) since {when}"

    @classmethod
    def me(cls) -> Holder:
        argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]] if sys.argv else [sys.executable]
        command = " ".join(argv)
        return cls(
            os.getpid(), command[:117] + "..." if len(command) > 120 else command, time.time()
        )

    @classmethod
    def read(cls, fd: int) -> Holder | None:
        """The holder written at the start of an open file; None while it is still empty."""
        try:
            data = json.loads(os.pread(fd, 1 << 20, 0) or b"null")
            return cls(int(data["pid"]), str(data["command"]), float(data["since"]))
        except (ValueError, TypeError, KeyError):
            return None

    def record(self) -> dict:
        return {"pid": self.pid, "command": self.command, "since": self.since}


def lock_path(cache: str | os.PathLike, key: str) -> Path:
    return Path(cache) / "locks" / f"{key}.lock"


def building(cache: str | os.PathLike, key: str) -> bool:
    """Whether some process holds avatar `key`'s build lock now (a probe, atomic.held)."""
    return held(lock_path(cache, key))


def _open_lock(path: Path) -> int:
    try:
        path.parent.mkdir(exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreNotWritableError(
            f"cannot create the precompile lock {path} ({exc.strerror}); the store is not "
            f"writable by this user: fix its permissions or choose another with --cache"
        ) from exc


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextmanager
def single_flight(
    cache: str | os.PathLike,
    key: str,
    wait: float = DEFAULT_WAIT,
    on_wait: Callable[[Holder | None], None] | None = None,
) -> Iterator[bool]:
    """Hold the build lock of avatar `key`; yields True when another holder was waited for.

    The caller re-checks for a hit once inside: the holder it waited for has usually just
    made it. on_wait(holder) is called once when the lock is busy (holder None when the
    holder has not written its name yet). Raises FlightTimeoutError after `wait` seconds
    and StoreNotWritableError when the lock file cannot be created.
    """
    path = lock_path(cache, key)
    fd = _open_lock(path)
    try:
        waited = not _try_lock(fd)
        if waited:
            _wait_for(fd, path, key, wait, on_wait)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(Holder.me().record()).encode(), 0)
        try:
            yield waited
        finally:
            os.ftruncate(fd, 0)  # a later waiter never names a holder that has gone
    finally:
        os.close(fd)  # releases the flock


def _wait_for(
    fd: int, path: Path, key: str, wait: float, on_wait: Callable[[Holder | None], None] | None
) -> None:
    start = time.monotonic()
    pause = POLL[0]
    holder = Holder.read(fd)
    while holder is None and time.monotonic() - start < 1.0:  # it writes right after locking
        if _try_lock(fd):
            return
        time.sleep(pause)
        holder = Holder.read(fd)
    if on_wait is not None:
        on_wait(holder)
    while not _try_lock(fd):
        if time.monotonic() - start > wait:
            who = Holder.read(fd) or holder
            raise FlightTimeoutError(
                f"gave up after {wait:.0f} s waiting for {who or 'another process'} to "
                f"precompile avatar {key[:16]} (lock {path}); raise flight_wait "
                f"(--flight-wait, HOTPLATE_FLIGHT_WAIT) or stop that process"
            )
        time.sleep(pause)
        pause = min(pause * 2, POLL[1])
