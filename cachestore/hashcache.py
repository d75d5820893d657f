"""Source digests with a stat cache, as dvc's state cache does it.

A cached digest is trusted only while device, inode, size, mtime_ns and ctime_ns
all match; anything else is rehashed. A file that changes while it is hashed is not
cached (FileChangedError propagates) so the caller retries it after it settles.

`snapshot` is the read a precompile decodes from: one private copy of the source,
hashed as it is copied, so the digest and the decoded frames come from the same bytes
even when the file is rewritten in place (rsync --inplace, a re-export) meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cachestore.atomic import create_locked, held
from cachestore.keys import FileStat, copy_and_hash, hash_file
from cachestore.space import raise_if_full
from cachestore.store import Store

HASH_VERSION = 1


def file_digest(store: Store | None, path: str | os.PathLike) -> str:
    """xxh3-128 of the file at path, from the stat cache when it is still valid."""
    path = Path(path).resolve()
    key = str(path)
    st = FileStat.of(path.stat())
    if store is not None:
        cached = store.read_value("hashcache", key)
        if cached and cached["v"] == HASH_VERSION and FileStat(**cached["stat"]) == st:
            return cached["digest"]
    digest, st = hash_file(path)
    if store is not None and not store.readonly:
        remember(store, path, st, digest)
    return digest


def remember(store: Store, path: str | os.PathLike, stat: FileStat, digest: str) -> None:
    """Trust `digest` for the file at path while its stat stays `stat` (e.g. after a
    rename inside the tree, where the bytes are known not to have changed)."""
    store.put(
        "hashcache",
        str(Path(path).resolve()),
        {"v": HASH_VERSION, "stat": dict(stat.__dict__), "digest": digest},
    )


SNAPSHOTS = "snapshots"  # folder in the store directory holding in-flight copies


@contextmanager
def snapshot(
    store: Store, path: str | os.PathLike, on_bytes: Callable[[int], None] | None = None
) -> Iterator[tuple[Path, str]]:
    """A private copy of the file at path and the digest of exactly its bytes.

    The copy lives in the store directory (same disk as what it becomes) until the
    block ends, locked (flock) meanwhile; copies nobody holds locked (their process was
    killed) are removed by the next snapshot.
    The stat cache learns the digest, since the file was unchanged during the copy.
    Raises FileChangedError (the file changed during the copy), StoreFullError
    (no space for the copy) and OSError.
    """
    path = Path(path).resolve()
    folder = store.path / SNAPSHOTS
    folder.mkdir(exist_ok=True)
    _remove_orphans(folder)
    # locked from before it has its name: the lock, not the pid, says it is live (pids
    # mean nothing across the PID namespaces of containers sharing one cache)
    name = f"{os.getpid()}-{os.urandom(6).hex()}{path.suffix}"
    lock = create_locked(folder, name)
    copy = folder / name
    try:
        try:
            digest, stat = copy_and_hash(path, copy, on_bytes)
        except OSError as exc:
            raise_if_full(exc, store.path, path.stat().st_size)
            raise
        if not store.readonly:
            remember(store, path, stat, digest)
        yield copy, digest
    finally:
        copy.unlink(missing_ok=True)
        os.close(lock)


def _remove_orphans(folder: Path) -> None:
    """Delete copies nobody holds locked (a precompile killed with -9): a live snapshot
    holds its flock until it ends, and the kernel drops it when its process dies."""
    for entry in folder.iterdir():
        if not entry.name.startswith(".") and not held(entry):
            entry.unlink(missing_ok=True)
