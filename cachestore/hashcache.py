"""Source digests with a stat cache, as dvc's state cache does it.

A cached digest is trusted only while device, inode, size, mtime_ns and ctime_ns
all match; anything else is rehashed. A file that changes while it is hashed is not
cached (FileChangedError propagates) so the caller retries it after it settles.
"""

from __future__ import annotations

import os
from pathlib import Path

from cachestore.keys import FileStat, hash_file
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
