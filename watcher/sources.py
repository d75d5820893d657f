"""The store's `source` table as the watcher keeps it.

Key: the personas-relative path (posix). Value: a small record

    root       the personas folder it belongs to (absolute); rows of other folders are
               left alone
    persona, attire, motion, kind
    stat       dev, ino, size, mtime_ns, ctime_ns when it was hashed
    digest     xxh3-128 of its bytes
    avatar     the avatar key under the recipe it was queued with
    state      queued | running | retry | hot | failed
    error      the last failure, one line ("" when none)
    attempts   failed attempts of the current content
    last_seen  wall time the daemon last saw the file
    updated    wall time of the last state change
    seconds    how long the precompile took (hot rows)

Only the daemon (or `hotplate sync`) writes it; workers write stages and avatars.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cachestore.keys import FileStat
from cachestore.store import Store, pack

QUEUED, RUNNING, RETRY, HOT, FAILED = "queued", "running", "retry", "hot", "failed"
STATES = (QUEUED, RUNNING, RETRY, HOT, FAILED)


def load_rows(store: Store, root: Path) -> dict[str, dict[str, Any]]:
    """Every row of this personas folder."""
    root_s = str(Path(root).resolve())
    return {
        k: v for k, v in store.items("source") if isinstance(v, dict) and v.get("root") == root_s
    }


def put_rows(store: Store, rows: Mapping[str, Mapping[str, Any]]) -> None:
    """Write several rows in one transaction."""
    if not rows:
        return
    packed = [(k.encode(), pack(dict(v))) for k, v in rows.items()]

    def txn_fn(txn: Any) -> None:
        for key, value in packed:
            txn.put(key, value, db=store.dbs["source"])

    store.write(txn_fn)


def delete_rows(store: Store, rels: Iterable[str]) -> int:
    keys = [r.encode() for r in rels]
    if not keys:
        return 0
    return store.write(lambda txn: sum(txn.delete(k, db=store.dbs["source"]) for k in keys))


def new_row(root: Path, source: Any, stat: FileStat, digest: str, avatar: str, state: str) -> dict:
    now = time.time()
    return {
        "root": str(Path(root).resolve()),
        "persona": source.persona,
        "attire": source.attire,
        "motion": source.motion,
        "kind": source.kind,
        "stat": dict(stat.__dict__),
        "digest": digest,
        "avatar": avatar,
        "state": state,
        "error": "",
        "attempts": 0,
        "last_seen": now,
        "updated": now,
        "seconds": None,
    }


def row_stat(row: Mapping[str, Any]) -> FileStat | None:
    try:
        return FileStat(**row["stat"])
    except (KeyError, TypeError):
        return None


def same_file(a: FileStat, b: FileStat) -> bool:
    """The same bytes by the stat cache's rules minus ctime, which a rename changes."""
    return (a.dev, a.ino, a.size, a.mtime_ns) == (b.dev, b.ino, b.size, b.mtime_ns)


def stat_of(path: Path) -> FileStat:
    return FileStat.of(os.stat(path))
