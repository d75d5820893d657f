"""gc: exactly what dry-run promises, idempotent, safe beside a concurrent writer.

Ages are made real by rewriting a manifest's `created` time (and an avatar's last use
in `access`) into the past, rather than by mocking the clock.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback

import numpy as np
import pytest

from cachestore.compact import compact
from cachestore.errors import MissingStageError, StoreBusyError
from cachestore.gc import collect
from cachestore.store import forget_store, open_store
from cachestore.verify import verify

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

HOUR = 3600.0
CONTENT_DBS = ("avatar", "stage", "blob")


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "store")
    yield s
    forget_store(tmp_path / "store")


def arrays(seed: int, kib: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "a": rng.integers(0, 256, kib << 10, dtype=np.uint8),
        "b": rng.random(16, dtype=np.float32),
    }


def avatar(store, key: str, seed: int, shared: str | None = None, kib: int = 8) -> dict:
    """An avatar of two stages; `shared` names an existing stage to reuse as the first."""
    first = shared or f"{key}-track"
    if shared is None:
        store.put_stage(first, "track", arrays(seed, kib), {})
    store.put_stage(f"{key}-masks", "masks", arrays(seed + 1, kib), {})
    record = {"stages": {"track": first, "masks": f"{key}-masks"}}
    store.put_avatar(key, record)
    return record


def age(store, db: str, key: str, seconds: float) -> None:
    """Move a manifest's creation (and an avatar's last use) `seconds` into the past."""
    record = store.read_value(db, key)
    record["created"] -= seconds
    store.put(db, key, record)
    if db == "avatar":
        store.put("access", key, time.time() - seconds)


def snapshot(store) -> dict[str, int]:
    """Every content entry as "db:key" -> bytes, measured as gc measures them."""
    out = {}
    with store.read() as r:
        for db in CONTENT_DBS:
            with r.txn.cursor(db=store.dbs[db]) as cur:
                out.update({f"{db}:{bytes(k).decode()}": len(k) + len(v) for k, v in cur})
    return out


def footprint(store, keys: set[str]) -> int:
    """Bytes of these avatars, their stages and their blobs, shared ones counted once."""
    snap = snapshot(store)
    stages = {s for k in keys for s in store.read_value("avatar", k)["stages"].values()}
    blobs = {d for s in stages for d in store.read_value("stage", s)["blobs"].values()}
    return (
        sum(snap[f"avatar:{k}"] for k in keys)
        + sum(snap[f"stage:{s}"] for s in stages)
        + sum(snap[f"blob:{d}"] for d in blobs)
    )


def test_dry_run_lists_exactly_what_gc_deletes_and_second_gc_deletes_nothing(store):
    old = 3 * HOUR
    rooted = avatar(store, "rooted", 1)
    avatar(store, "pinned", 10)
    shares = avatar(store, "shares", 20, shared=rooted["stages"]["track"])
    avatar(store, "used", 30)  # old, but used within the grace period
    avatar(store, "young", 40)  # created within the grace period
    avatar(store, "stale", 50)
    store.put_stage("orphan-old", "track", arrays(60), {})
    store.put_stage("orphan-young", "track", arrays(70), {})
    store.put_stage("blob-only", "track", {"z": np.arange(999)}, {})
    store.delete("stage", "blob-only")  # leaves an unnamed blob
    store.put_stage("dup", "masks", {"same": arrays(50)["a"]}, {})  # young; shares stale's blob
    for key in ("rooted", "pinned", "shares", "used", "stale"):
        age(store, "avatar", key, old)
    for key, _ in store.items("stage"):
        if key not in ("orphan-young", "dup", "young-track", "young-masks"):
            age(store, "stage", key, old)
    store.put("access", "used", time.time() - 60)
    store.put("pin", "pinned", {"time": time.time()})

    before = snapshot(store)
    dry = collect(store, {"rooted"}, grace=HOUR, dry_run=True)
    assert snapshot(store) == before  # a dry run deletes nothing
    real = collect(store, {"rooted"}, grace=HOUR)
    after = snapshot(store)

    assert dry.freed == real.freed and dry.lines() == real.lines()
    removed = set(before) - set(after)
    assert removed == set(real.freed)
    assert sum(before[e] for e in removed) == real.reclaimed == dry.reclaimed
    assert real.total_entries == len(before) and real.total_bytes == sum(before.values())
    assert {k for k in removed if k.startswith("avatar:")} == {"avatar:shares", "avatar:stale"}
    assert {k for k in removed if k.startswith("stage:")} == {
        "stage:shares-masks",
        "stage:stale-track",
        "stage:stale-masks",
        "stage:orphan-old",
    }
    # The shared track stage stays for its rooted avatar; blobs go only when nothing names them.
    assert f"stage:{shares['stages']['track']}" in after
    # shares-masks 2, stale-track 1 (dup keeps the other), stale-masks 2, orphan-old 2, unnamed 1
    assert len([k for k in removed if k.startswith("blob:")]) == 8
    for key in ("rooted", "pinned", "used", "young"):
        assert store.get_avatar(key) is not None, key
    assert store.get_stage("orphan-young") is not None
    assert store.read_value("access", "stale") is None
    assert verify(store)[1] == []

    again = collect(store, {"rooted"}, grace=HOUR)
    assert again.deleted == 0 and again.reclaimed == 0 and again.freed == {}
    assert snapshot(store) == after
    assert store.read_value("meta", "last_gc")["deleted"] == 0


def test_gc_between_stage_and_avatar_write_refuses_the_avatar(store):
    store.put_stage("s1", "track", arrays(1), {})
    plan = collect(store, (), grace=0)
    assert "stage:s1" in plan.freed
    with pytest.raises(MissingStageError, match="s1"):
        store.put_avatar("av", {"stages": {"track": "s1"}})
    assert store.items("avatar") == []
    store.put_stage("s1", "track", arrays(1), {})  # the writer's recovery: rewrite, retry
    store.put_avatar("av", {"stages": {"track": "s1"}})
    assert store.get_avatar("av") is not None


def test_max_size_evicts_least_recently_used_first(store):
    for i in range(5):
        avatar(store, f"av{i}", 100 * i, kib=32)
    avatar(store, "av5", 500, shared="av4-track", kib=32)  # shares a stage with av4
    now = time.time()
    # last use, oldest first: av2, av0 (pinned), av4, av1, av5, av3
    for rank, key in enumerate(("av2", "av0", "av4", "av1", "av5", "av3")):
        store.put("access", key, now - 100 + rank)
    store.put("pin", "av0", {"time": now})
    roots = {f"av{i}" for i in range(6)}

    cap = footprint(store, {"av0", "av1", "av3", "av5"})
    plan = collect(store, roots, grace=HOUR, max_size=cap)
    # av2 goes first; dropping av4 alone frees only its masks (av5 still needs its track).
    assert {k for k, _ in store.items("avatar")} == {"av0", "av1", "av3", "av5"}
    assert set(plan.avatars) == {"av2", "av4"}
    assert store.get_stage("av4-track") is not None
    assert sum(snapshot(store).values()) <= cap
    assert verify(store)[1] == []
    assert collect(store, roots, grace=HOUR, max_size=cap).deleted == 0

    cap = footprint(store, {"av0", "av1", "av3", "av5"}) - 1  # one byte short: next LRU goes
    collect(store, roots, grace=HOUR, max_size=cap)
    assert {k for k, _ in store.items("avatar")} == {"av0", "av3", "av5"}
    assert sum(snapshot(store).values()) <= cap

    collect(store, roots, grace=HOUR, max_size=0)  # the pinned avatar survives any cap
    assert {k for k, _ in store.items("avatar")} == {"av0"}
    assert store.get_avatar("av0") is not None and verify(store)[1] == []


def test_compact_shrinks_after_gc_and_store_still_reads(tmp_path):
    path = tmp_path / "store"
    store = open_store(path)
    for i in range(30):
        avatar(store, f"av{i}", i * 10, kib=128)
    keep = {"av3": store.load_arrays("av3-track"), "av17": store.load_arrays("av17-masks")}
    collect(store, {"av3", "av17"}, grace=0)
    before_file = (path / "data.mdb").stat().st_size
    before, after = compact(path)  # closes this process's handle itself
    assert before == before_file and after < before / 4
    store = open_store(path)
    try:
        assert verify(store)[1] == []
        assert {k for k, _ in store.items("avatar")} == {"av3", "av17"}
        got = {"av3": store.load_arrays("av3-track"), "av17": store.load_arrays("av17-masks")}
        for key, expected in keep.items():
            assert all(np.array_equal(got[key][n], expected[n]) for n in expected)
        avatar(store, "av-new", 999)  # and it takes writes again
        assert store.get_avatar("av-new") is not None
    finally:
        forget_store(path)


def hold_open(path: str, readonly: bool, opened, release) -> None:
    store = open_store(path, readonly=readonly)
    store.get_avatar("av0")
    opened.release()
    release.wait(60)


@pytest.mark.parametrize("readonly", [False, True], ids=["writer", "reader"])
def test_compact_refuses_while_another_process_holds_the_store(tmp_path, readonly):
    path = tmp_path / "store"
    store = open_store(path)
    avatar(store, "av0", 1)
    forget_store(path)
    ctx = mp.get_context("spawn")
    opened, release = ctx.Semaphore(0), ctx.Event()
    child = ctx.Process(target=hold_open, args=(str(path), readonly, opened, release))
    child.start()
    try:
        assert opened.acquire(timeout=60)
        data = (path / "data.mdb").read_bytes()
        with pytest.raises(StoreBusyError, match="another process"):
            compact(path)
        assert (path / "data.mdb").read_bytes() == data
    finally:
        release.set()
        child.join(timeout=30)
    compact(path)
    store = open_store(path)
    assert store.get_avatar("av0") is not None
    forget_store(path)


# -- gc in one process, a writer in another ---------------------------------------------

ROOTED = frozenset(f"av-{i}" for i in range(0, 20_000, 2))  # even avatars are rooted


def gc_loop(path: str, ready, stop, asked, answered, results) -> None:
    """gc back to back; after a pass that began once `asked` was set, release `answered`."""
    try:
        store = open_store(path)
        ready.release()
        runs = deleted = 0
        rng = np.random.default_rng(os.getpid())
        while not stop.is_set():
            ask = asked.is_set()
            deleted += collect(store, ROOTED, grace=0).deleted
            runs += 1
            if ask:
                asked.clear()
                answered.release()
            # grace=0 back to back would starve the writer; real gc runs are spaced out
            stop.wait(rng.uniform(0, 0.01))
        results.put(("gc", runs, deleted, None))
    except Exception:
        results.put(("gc", 0, 0, traceback.format_exc()))


def stage_then_avatar_writer(path: str, count: int, asked, answered, results) -> None:
    """`count` avatars, each after its stages; for every third one a whole gc pass is made
    to land between the stage writes and the avatar write (an event, not a 2 ms window)."""
    try:
        store = open_store(path)
        rng = np.random.default_rng(os.getpid())
        written, refused = [], 0
        for seq in range(count):
            stages = {"track": f"st-{seq}-track", "masks": f"st-{seq}-masks"}
            for attempt in range(100):
                for name, key in stages.items():
                    data = {"a": rng.integers(0, 256, 4096, dtype=np.uint8), "seq": np.int64(seq)}
                    store.put_stage(key, name, data, {"seq": seq})
                if seq % 3 == 0 and attempt == 0:
                    asked.set()
                    assert answered.acquire(timeout=60), "gc never answered"
                try:
                    store.put_avatar(f"av-{seq}", {"stages": stages, "seq": seq})
                    break
                except MissingStageError:
                    refused += 1
            else:
                raise AssertionError(f"avatar {seq} refused 100 times")
            written.append(seq)
        results.put(("writer", written, refused, None))
    except Exception:
        results.put(("writer", [], 0, traceback.format_exc()))


@pytest.mark.slow
def test_gc_beside_a_concurrent_writer_never_leaves_dangling_manifests(tmp_path):
    path = str(tmp_path / "store")
    forget_store(open_store(path).path)
    ctx = mp.get_context("spawn")
    ready, stop, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    asked, answered = ctx.Event(), ctx.Semaphore(0)
    gc_proc = ctx.Process(target=gc_loop, args=(path, ready, stop, asked, answered, results))
    gc_proc.start()
    assert ready.acquire(timeout=60)
    writer = ctx.Process(target=stage_then_avatar_writer, args=(path, 30, asked, answered, results))
    writer.start()
    writer.join(timeout=120)
    stop.set()
    got = {tag: rest for tag, *rest in (results.get(timeout=60) for _ in range(2))}
    gc_proc.join(timeout=30)
    assert got["writer"][2] is None, got["writer"][2]
    assert got["gc"][2] is None, got["gc"][2]
    written, refused = got["writer"][0], got["writer"][1]
    runs, deleted = got["gc"][0], got["gc"][1]
    assert written == list(range(30)) and runs >= 10 and deleted > 0
    # each forced pass removed the fresh stages, so their avatar write was refused once
    assert refused >= 10, "an avatar was written over stages gc had removed"

    store = open_store(path)
    try:
        assert verify(store)[1] == []
        for seq in written:
            rec = store.get_avatar(f"av-{seq}")
            if seq % 2 == 0:
                assert rec is not None and rec["seq"] == seq, f"rooted avatar {seq} lost"
        for _, rec in store.items("avatar"):
            for stage in rec["stages"].values():
                arrays = store.load_arrays(stage)
                assert arrays is not None and int(arrays["seq"]) == rec["seq"]
    finally:
        forget_store(path)


# A fresh process (nothing of the map touched yet) runs gc over a store of 48 MiB of blobs:
# how much of the file gc brings into memory says whether it read the blobs.
GC_ALONE = """
import json, sys
from cachestore.gc import collect
from cachestore.store import open_store
def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ":"))
store = open_store(sys.argv[1])
roots = [k for k, _ in store.items("avatar")]
before = rss("RssFile")
plan = collect(store, roots, grace=0)
print(json.dumps({"file": rss("RssFile") - before, "total": plan.total_bytes,
                  "deleted": plan.deleted}))
"""


def test_gc_measures_blobs_by_their_records_without_reading_them(tmp_path):
    """gc holds the lease barrier from its listing to its commit, so every new lease in
    every process waits for it: it must not read the store's blobs to size them."""
    import json
    import subprocess
    import sys

    from tests.cachestore.test_map_growth import ROOT

    store = open_store(tmp_path / "store")
    for i in range(24):  # 24 avatars of one 2 MiB blob each (and a small one)
        avatar(store, f"a{i}", i * 2, kib=1024)
    store.put_stage("orphan", "track", arrays(99), {})  # an orphan: read, it is all gc reads
    total = sum(snapshot(store).values())
    forget_store(tmp_path / "store")

    done = subprocess.run(
        [sys.executable, "-c", GC_ALONE, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    facts = json.loads(done.stdout)
    # sized right all the same; the orphan stage and its two blobs went
    assert facts["total"] == total and facts["deleted"] == 3, facts
    # the blobs are 48 MiB; gc touched a few pages of the map (records, keys), not them
    assert facts["file"] < 8 << 20, facts
