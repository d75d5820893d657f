"""A warm process's hit check remembers the blobs it hashed, and still sees every rewrite.

Real LMDB, a real precompiled avatar. The hit check (`pipeline.hot.hot_check`) of a
process that hashed an avatar's blobs once does not hash them again while LMDB has not
moved them (a warm server's request pays a header check, not a hash of every frame);
damage written through LMDB, by this process or another, moves the value, so the next
check hashes it and calls the stage damaged. Bytes changed under LMDB's feet (the file
written directly) are what the remembered check does not hash: every frame read still
does, so such a frame is refused, never shown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cachestore import codec
from cachestore.store import forget_store, open_store
from hotplate.demo_data import write_loop_video
from pipeline.hot import hot_check, load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from testkit.blobs import flip_one_byte

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

FRAMES = 6


# Flip one payload byte of a blob through LMDB, from another process (as a second
# worker, or `hotplate verify --repair` rewriting it, would write).
FLIPPER = """
import sys
from cachestore.store import open_store
from testkit.blobs import flip_one_byte
flip_one_byte(open_store(sys.argv[1]), sys.argv[2])
"""


# Grow the map from another process: a value larger than the room left in a store opened
# with a small map (as a second worker's big build would).
GROWER = """
import os, sys
from cachestore.store import open_store
store = open_store(sys.argv[1], map_size=int(sys.argv[2]))
before = store.env.info()["map_size"]
filler = os.urandom(int(sys.argv[2]))
store.write(lambda txn: txn.put(b"filler", filler, db=store.dbs["meta"]), len(filler))
assert store.env.info()["map_size"] > before
"""
SMALL_MAP = 64 << 20


@pytest.fixture
def hot(tmp_path):
    """(the store, the avatar key) of a small loop precompiled in this process."""
    source = write_loop_video(tmp_path / "loop.mp4", n_frames=FRAMES, size=(270, 480))
    store = open_store(tmp_path / "cache", map_size=SMALL_MAP)
    report = precompile(source, Recipe(max_frames=FRAMES), store)
    yield store, report.avatar
    forget_store(tmp_path / "cache")


def flip_under_lmdb(store, digest: str) -> None:
    """Flip one payload byte in data.mdb itself: LMDB does not move the value."""
    with store.read() as r:  # the blob's bytes, to find them in data.mdb
        value = bytes(r.txn.get(digest.encode(), db=store.dbs["blob"]))
    head = codec.read_header(value)
    data = store.path / "data.mdb"
    at = data.read_bytes().find(value)
    assert at >= 0, "the blob is not stored contiguously"
    with open(data, "r+b") as f:
        f.seek(at + head.offset + head.nbytes // 2)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x10]))


def frame_digest(store, avatar: str, i: int = 3) -> str:
    blobs = store.get_stage(store.get_avatar(avatar)["stages"]["decode"]).blobs
    return blobs[f"frame/{i:06d}"]


def test_damage_written_through_lmdb_by_another_process_is_seen_by_a_warm_check(hot):
    store, avatar = hot
    assert hot_check(store, avatar)[1] == []
    assert hot_check(store, avatar)[1] == []  # warm: remembered, still hot
    digest = frame_digest(store, avatar)
    flipped = subprocess.run([sys.executable, "-c", FLIPPER, str(store.path), digest])
    assert flipped.returncode == 0
    assert hot_check(store, avatar)[1] == ["decode"]
    with store.read() as r:  # the hit check removed the damaged blob: listings see it too
        assert r.txn.get(digest.encode(), db=store.dbs["blob"]) is None


def test_damage_written_in_this_process_is_seen_by_a_warm_check(hot):
    store, avatar = hot
    assert hot_check(store, avatar)[1] == []
    flip_one_byte(store, frame_digest(store, avatar, 1))
    assert hot_check(store, avatar)[1] == ["decode"]


def test_a_warm_check_does_not_hash_again_and_a_frame_read_still_does(hot):
    store, avatar = hot
    assert hot_check(store, avatar)[1] == []
    flip_under_lmdb(store, frame_digest(store, avatar))
    # remembered and unmoved: not hashed again (a full check, as verify runs, sees it)
    assert hot_check(store, avatar)[1] == []
    assert store.damaged_stages(store.get_avatar(avatar)["stages"]) == ["decode"]
    # the frame read hashes its blob: the damaged frame is refused, never decoded
    with pytest.raises(codec.CodecError):
        load_assets(store, avatar).load_frame(3)


def test_a_map_grown_by_another_process_makes_the_warm_check_hash_again(hot):
    """A remembered spot is only good in the map it was taken in: once this process adopts
    another's growth (issue 48: no test grew the map in another process), the check
    hashes again, and sees what changed meanwhile."""
    store, avatar = hot
    assert hot_check(store, avatar)[1] == []
    flip_under_lmdb(store, frame_digest(store, avatar))
    assert hot_check(store, avatar)[1] == []  # remembered and unmoved: not hashed
    epoch, remembered = store._map_epoch, len(store._hashed)
    grown = subprocess.run([sys.executable, "-c", GROWER, str(store.path), str(SMALL_MAP)])
    assert grown.returncode == 0
    with store.read() as r:  # the first read adopts the growth
        assert r.txn.get(b"filler", db=store.dbs["meta"]) is not None
    assert store.env.info()["map_size"] > SMALL_MAP
    # Every spot was forgotten, and a new one is of the new map: the kernel puts a grown
    # map elsewhere, so a stale spot matching a moved value is a coincidence no test can
    # make on demand; these two are what keep it from being trusted.
    assert remembered > 0 and not store._hashed
    assert store._map_epoch > epoch
    assert hot_check(store, avatar)[1] == ["decode"]  # hashed again: the flip is seen
    assert store._hashed and {s[2] for s in store._hashed.values()} == {store._map_epoch}
