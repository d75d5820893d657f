"""Compaction: LMDB files never shrink, so write a compacted copy and swap it in.

Every open Store holds a shared flock on `hold.lock`; compaction takes it exclusively
(without waiting), so it runs only when no other process has the store open. A live
render lease is refused first, by name, so the user learns which render to wait for. The
copy is written beside the store and moved over `data.mdb` with one rename.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import lmdb

from cachestore.errors import StoreBusyError
from cachestore.leases import live_leases
from cachestore.store import forget_store


def compact(path: str | os.PathLike) -> tuple[int, int]:
    """Rewrite the store at path compactly; returns (bytes before, bytes after).

    Raises StoreBusyError when a render holds a lease or another process has the store open.
    """
    path = Path(path).resolve()
    leases = live_leases(path)
    if leases:
        raise StoreBusyError(
            f"{path} is being read under {len(leases)} lease(s), first by {leases[0].holder}; "
            f"wait for it to finish and run gc --compact again"
        )
    forget_store(path)  # our own handle would block the exclusive hold
    fd = os.open(path / "hold.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreBusyError(
                f"{path} is open in another process (a daemon or a render); stop it and run gc --compact again"
            ) from None
        before = (path / "data.mdb").stat().st_size
        tmp = path.parent / f".{path.name}.compact-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=16)
        try:
            env.copy(str(tmp), compact=True)
        finally:
            env.close()
        os.replace(tmp / "data.mdb", path / "data.mdb")
        (path / "lock.mdb").unlink(
            missing_ok=True
        )  # nobody else has it open: we hold it exclusively
        shutil.rmtree(tmp, ignore_errors=True)
        return before, (path / "data.mdb").stat().st_size
    finally:
        os.close(fd)
