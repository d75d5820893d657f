"""What the store holds: entries and bytes per database, counters, last gc."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cachestore.store import DATABASES, Store


@dataclass
class StoreStats:
    path: str
    file_bytes: int
    map_size: int
    entries: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    last_gc: dict[str, Any] | None = None


def store_stats(store: Store) -> StoreStats:
    """Count every database; values' bytes are summed by a cursor walk (no decoding)."""
    data = store.path / "data.mdb"
    stats = StoreStats(
        str(store.path), data.stat().st_size if data.exists() else 0, store.env.info()["map_size"]
    )
    with store.read() as r:
        for db in DATABASES:
            n = size = 0
            with r.txn.cursor(db=store.dbs[db]) as cur:
                for k, v in cur:
                    n += 1
                    size += len(k) + len(v)
            stats.entries[db], stats.bytes[db] = n, size
        for key, value in r.items("meta"):
            if key.startswith("count:"):
                stats.counters[key[6:]] = value
        stats.last_gc = r.get("meta", "last_gc")
    return stats
