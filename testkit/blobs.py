"""Damage to a store's blobs, as the integrity tests make it (pytest-free)."""

from __future__ import annotations

from cachestore import codec


def flip_one_byte(store, digest: str) -> None:
    """Flip one payload byte of a blob, written through LMDB (so the value moves)."""
    db = store.dbs["blob"]

    def flip(txn):
        value = bytearray(txn.get(digest.encode(), db=db))
        head = codec.read_header(value)
        value[head.offset + head.nbytes // 2] ^= 0x10
        txn.put(digest.encode(), bytes(value), db=db)

    store.write(flip)
