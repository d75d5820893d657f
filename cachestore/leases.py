"""Render leases, as Nix's temporary roots: what a long reader needs, gc keeps.

A reader that spans many read transactions (a render reads one per frame) leases the
avatar keys it reads. A lease is a file `<cache>/leases/<pid>-<n>.lease` holding the
holder (pid, command, start time) and the keys, under an exclusive `flock` for as long
as the lease lives. The lock, not the pid, says the lease is live: the kernel drops it
when the holder exits or is killed, so a reused pid can never keep a dead lease alive.
gc reads the live leases as roots and removes the files of dead ones.

The race between "gc listed the leases" and "a reader leased and found the avatar hot"
is closed by a barrier: gc holds `leases/.gc.lock` exclusively from listing the leases
until its transaction commits, and a new lease passes through it (shared) after its
file is visible and before the reader looks for the avatar. So a reader either is seen
by gc, or looks only after gc has committed (and finds the avatar cold, and rebuilds).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cachestore.flight import Holder

LEASES = "leases"
BARRIER = ".gc.lock"
_SERIAL = itertools.count()


@dataclass(frozen=True)
class LeaseInfo:
    holder: Holder
    keys: tuple[str, ...]
    path: Path


class Lease:
    """A live lease; `release()` (or leaving the `with`) ends it."""

    def __init__(self, cache: str | os.PathLike, keys: Iterable[str]) -> None:
        folder = Path(cache) / LEASES
        folder.mkdir(exist_ok=True)
        self.keys = tuple(keys)
        self.holder = Holder.me()
        name = f"{self.holder.pid}-{next(_SERIAL)}-{os.urandom(3).hex()}.lease"
        self.path = folder / name
        # locked before it is visible under its name, so gc never sees it unlocked
        tmp = folder / f".{name}.tmp"
        self._fd: int | None = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        record = {**self.holder.record(), "keys": list(self.keys)}
        os.write(self._fd, json.dumps(record).encode())
        os.rename(tmp, self.path)
        _pass_barrier(folder)

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _pass_barrier(folder: Path) -> None:
    """Wait for a gc that may have listed the leases before this one appeared."""
    fd = os.open(folder / BARRIER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def lease_unavailable(cache: str | os.PathLike) -> str | None:
    """Why no lease can be taken on this store (None when one can): a lease is a file."""
    folder = Path(cache) / LEASES
    target = folder if folder.is_dir() else Path(cache)
    if not os.access(target, os.W_OK | os.X_OK):
        return f"{target} is not writable by this user"
    return None


@contextmanager
def gc_barrier(cache: str | os.PathLike) -> Iterator[None]:
    """Held by gc from listing the leases until its deletions commit."""
    folder = Path(cache) / LEASES
    folder.mkdir(exist_ok=True)
    fd = os.open(folder / BARRIER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def live_leases(cache: str | os.PathLike, clean: bool = True) -> list[LeaseInfo]:
    """Every live lease on the store; with clean, remove the files of dead holders."""
    folder = Path(cache) / LEASES
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        if path.name == BARRIER:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # released while we listed
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # locked: its holder is alive
                info = _read(fd, path)
                if info is not None:
                    found.append(info)
                continue
            if clean:  # unlocked: the holder is gone (or is releasing it right now)
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return found


def _read(fd: int, path: Path) -> LeaseInfo | None:
    holder = Holder.read(fd)
    if holder is None or not path.name.endswith(".lease"):
        return None  # a temporary name: locked, being written, not yet a lease
    record = json.loads(os.pread(fd, 1 << 20, 0))
    return LeaseInfo(holder, tuple(record.get("keys", ())), path)


def leased_keys(cache: str | os.PathLike) -> set[str]:
    """The keys every live lease names (dead leases are cleaned on the way)."""
    return {key for info in live_leases(cache) for key in info.keys}
