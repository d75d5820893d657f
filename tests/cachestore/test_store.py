import os
import stat
import subprocess

import numpy as np
import pytest

from cachestore.errors import MissingStageError, StoreDamagedError, StoreNotWritableError
from cachestore.hashcache import file_digest
from cachestore.keys import FileChangedError, avatar_key, hash_file, stage_key
from cachestore.stats import store_stats
from cachestore.store import Store, forget_store, open_store
from cachestore.verify import verify
from testkit.preconditions import require

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "store")
    yield s
    forget_store(tmp_path / "store")


def test_stage_round_trip_and_copies(store):
    arrays = {"boxes": np.random.rand(10, 4).astype("f4"), "crops": np.zeros((2, 8, 8, 3), "u1")}
    rec = store.put_stage("k1", "track", arrays, {"frames": 10})
    got = store.load_arrays("k1")
    assert set(got) == set(arrays) and all(np.array_equal(got[n], arrays[n]) for n in arrays)
    assert got["boxes"].flags.owndata  # copies leave the transaction
    assert store.get_stage("k1").blobs == rec.blobs
    with store.read() as r:
        view = r.array(rec.blobs["boxes"])
        assert not view.flags.owndata


def test_identical_arrays_share_one_blob(store):
    a = np.arange(100, dtype="<i4")
    r1 = store.put_stage("k1", "x", {"a": a}, {})
    r2 = store.put_stage("k2", "x", {"b": a.copy()}, {})
    assert r1.blobs["a"] == r2.blobs["b"]
    assert store_stats(store).entries["blob"] == 1


def test_manifest_naming_missing_or_damaged_blob_is_a_miss(store):
    rec = store.put_stage("k1", "x", {"a": np.arange(50)}, {})
    store.write(lambda txn: txn.put(rec.blobs["a"].encode(), b"HPA1garbage", db=store.dbs["blob"]))
    assert store.load_arrays("k1") is None
    assert verify(store)[1]
    store.delete("blob", rec.blobs["a"])
    assert store.get_stage("k1") is None


def test_avatar_refuses_missing_stage(store):
    store.put_stage("s1", "x", {"a": np.arange(3)}, {})
    store.put_avatar("av", {"stages": {"x": "s1"}})
    assert store.get_avatar("av")["stages"] == {"x": "s1"}
    with pytest.raises(MissingStageError):
        store.put_avatar("av2", {"stages": {"x": "s1", "y": "nope"}})


def test_map_grows_from_tiny(tmp_path):
    s = Store(tmp_path / "tiny", map_size=64 * 1024)
    for i in range(20):
        s.put_stage(f"k{i}", "x", {"a": np.random.rand(64, 64)}, {})
    assert s.env.info()["map_size"] > 64 * 1024
    assert all(s.load_arrays(f"k{i}") is not None for i in range(20))
    s.close()


def test_truncated_or_foreign_file_is_refused_not_recreated(tmp_path):
    (tmp_path / "asfile").write_text("hello")
    with pytest.raises(StoreDamagedError, match="move it aside"):
        Store(tmp_path / "asfile")
    d = tmp_path / "trunc"
    d.mkdir()
    (d / "data.mdb").write_bytes(os.urandom(100))
    with pytest.raises(StoreDamagedError, match="truncated"):
        Store(d)
    assert (d / "data.mdb").stat().st_size == 100
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "data.mdb").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(StoreDamagedError):
        Store(junk)
    assert (junk / "data.mdb").stat().st_size == 64 * 1024


def test_unwritable_cache_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores directory modes, but not a read-only filesystem
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)])
        require(done.returncode == 0, "root cannot mount a read-only tmpfs here")
    else:
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(StoreNotWritableError, match="not writable"):
            Store(ro / "store")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)])


def test_unwritable_cache_refused_on_readonly_fs(tmp_path):
    with pytest.raises(StoreNotWritableError, match="HOTPLATE_CACHE"):
        Store("/proc/hotplate-store")


def test_open_store_is_once_per_process(tmp_path):
    assert open_store(tmp_path / "s") is open_store(tmp_path / "s")
    forget_store(tmp_path / "s")


def test_hashing_and_stat_cache(store, tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    digest, _ = hash_file(f)
    assert file_digest(store, f) == digest
    assert store.read_value("hashcache", str(f.resolve()))["digest"] == digest
    with open(f, "r+b") as h:
        h.seek(10)
        h.write(b"changed!")
    assert file_digest(store, f) != digest  # stat changed: rehashed


def test_file_changed_while_hashing(tmp_path):
    f = tmp_path / "g.bin"
    f.write_bytes(b"x" * (20 << 20))
    calls = []

    def grow(n):
        if not calls:
            with open(f, "ab") as h:
                h.write(b"more")
        calls.append(n)

    with pytest.raises(FileChangedError):
        hash_file(f, on_bytes=grow)


def test_keys_are_canonical():
    assert stage_key("track", 1, {"a": 1, "b": 2}) == stage_key("track", 1, {"b": 2, "a": 1})
    assert stage_key("track", 1, {"a": 1}) != stage_key("track", 2, {"a": 1})
    assert stage_key("track", 1, {}, model="m1") != stage_key("track", 1, {}, model="m2")
    assert avatar_key("d", ["a", "b"]) != avatar_key("d", ["b", "a"])
