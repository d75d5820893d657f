"""Readers in other processes always see whole manifests, whatever the writer does.

Every array of stage `seq` is filled with `seq` and the stage and avatar manifests
carry `seq` in their meta, so a reader can tell from one read transaction whether
what it sees is consistent: every stage an avatar names is present with the same seq,
every blob each stage names is present, undamaged and full of that seq.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback

import numpy as np
import pytest

from cachestore import codec
from cachestore.gc import collect
from cachestore.store import Store, forget_store, open_store

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

STAGES = ("track", "crops", "masks")
SLOTS = 8  # avatar keys the writer keeps overwriting
WRITES = 60  # avatars the writer writes while four readers read
TINY = 64 << 10


def stage_arrays(seq: int, index: int) -> dict[str, np.ndarray]:
    # Shapes differ per stage so the stages of one avatar do not share blobs.
    return {
        "frames": np.full((4 + index, 40 + seq % 13, 32), seq, np.int32),
        "boxes": np.full((20 + index, 4), seq, np.float32),
    }


def write_avatar(store, seq: int, key: str) -> None:
    stages = {}
    for index, name in enumerate(STAGES):
        stage = f"st-{seq}-{name}"
        store.put_stage(stage, name, stage_arrays(seq, index), {"seq": seq})
        stages[name] = stage
    store.put_avatar(key, {"stages": stages, "seq": seq})


def check_avatar(r, key: str, rec: dict) -> str | None:
    """Why this avatar, as seen in read transaction r, is inconsistent; None if it is not."""
    seq = rec["seq"]
    if set(rec["stages"]) != set(STAGES):
        return f"{key}: partial manifest {sorted(rec['stages'])}"
    for name, stage_key in rec["stages"].items():
        stage = r.get("stage", stage_key)
        if stage is None:
            return f"{key}: stage {name} {stage_key} missing"
        if stage["meta"]["seq"] != seq:
            return f"{key}: stage {name} has seq {stage['meta']['seq']}, avatar {seq}"
        for array_name, digest in stage["blobs"].items():
            try:
                array = r.array(digest)
            except (KeyError, codec.CodecError) as exc:
                return f"{key}: {name}/{array_name}: {exc}"
            if array.size == 0 or not (array == seq).all():
                return f"{key}: {name}/{array_name} does not hold seq {seq}"
    return None


def reader(path: str, ready, stop, count, results) -> None:
    """Reads until stopped, adding one to `count` after each read transaction."""
    reads = avatars = 0
    violations: list[str] = []
    try:
        store = open_store(path)
        ready.release()
        while not stop.is_set():
            with store.read() as r:
                for key, rec in r.items("avatar"):
                    avatars += 1
                    if (problem := check_avatar(r, key, rec)) is not None:
                        violations.append(problem)
            # The public helpers too: a manifest is whole or absent, never partial.
            rec = store.get_avatar("av-0")
            if rec is not None and set(rec["stages"]) != set(STAGES):
                violations.append(f"get_avatar returned a partial manifest {rec}")
            reads += 1
            count.value += 1
    except Exception:
        violations.append(traceback.format_exc())
    results.put((reads, avatars, violations[:5], len(violations)))


def wait_for_reads(counts, timeout: float = 60) -> None:
    """Block until every reader has finished a read that began after this call."""
    start = [c.value for c in counts]
    deadline = time.monotonic() + timeout
    while any(c.value < s + 2 for c, s in zip(counts, start, strict=True)):
        if time.monotonic() > deadline:
            raise AssertionError("a reader stopped reading")
        time.sleep(0.001)


def writer(path: str, count: int, reads, results) -> None:
    """`count` overwrites, creations and gcs; every reader reads between each ten."""
    store = open_store(path)
    for seq in range(1, count + 1):
        write_avatar(store, seq, f"av-{seq % SLOTS}")  # overwrite
        if seq % 5 == 0:
            write_avatar(store, seq * 1000, f"av-new-{seq}")  # create
        if seq % 10 == 0:  # drop overwritten stages and all but the newest created avatars
            roots = {f"av-{i}" for i in range(SLOTS)} | {f"av-new-{seq - 5}", f"av-new-{seq}"}
            collect(store, roots, grace=0)
            wait_for_reads(reads)
    results.put(("writer", count))


@pytest.mark.slow
def test_four_readers_one_writer(tmp_path):
    path = str(tmp_path / "store")
    forget_store(open_store(path).path)  # created before anyone reads
    ctx = mp.get_context("spawn")
    ready, stop, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    counts = [ctx.RawValue("q", 0) for _ in range(4)]
    readers = [ctx.Process(target=reader, args=(path, ready, stop, c, results)) for c in counts]
    for p in readers:
        p.start()
    for _ in readers:
        assert ready.acquire(timeout=60), "a reader never opened the store"
    w = ctx.Process(target=writer, args=(path, WRITES, counts, results))
    w.start()
    w.join(timeout=120)
    stop.set()
    got = [results.get(timeout=60) for _ in range(5)]
    for p in readers:
        p.join(timeout=30)
    assert w.exitcode == 0 and all(p.exitcode == 0 for p in readers)

    written = [seq for tag, seq in (g for g in got if g[0] == "writer")]
    assert written == [WRITES], f"writer only wrote {written}"
    for reads, avatars, sample, n_violations in (g for g in got if g[0] != "writer"):
        assert n_violations == 0, sample
        # two whole reads between each ten writes, by construction (wait_for_reads)
        assert reads >= 2 * WRITES // 10 and avatars > 0, f"a reader only did {reads} reads"

    store = open_store(path)
    try:
        with store.read() as r:
            assert all(check_avatar(r, k, rec) is None for k, rec in r.items("avatar"))
    finally:
        forget_store(path)


def growing_reader(path: str, ready, done, final, count, results) -> None:
    """Opens while the map is 64 KiB and keeps reading while another process grows it."""
    try:
        store = open_store(path, map_size=TINY)
        first_map = store.env.info()["map_size"]
        ready.release()
        reads, seen = 0, -1
        while True:
            finished = done.is_set()
            with store.read() as r:
                rec = r.get("avatar", "av")
                if rec is not None:
                    if (problem := check_avatar(r, "av", rec)) is not None:
                        raise AssertionError(problem)
                    seen = max(seen, rec["seq"])
            reads += 1
            count.value += 1
            if finished:
                break
        results.put((reads, seen, final.value, first_map, store.env.info()["map_size"], None))
    except Exception:
        results.put((0, -1, -1, 0, 0, traceback.format_exc()))


def growing_writer(path: str, ready, done, final, reads) -> None:
    assert ready.acquire(timeout=60)
    store = open_store(path, map_size=TINY)
    for seq in range(1, 41):  # about 40 x 3 x 60 KiB: the map doubles several times
        stages = {}
        for index, name in enumerate(STAGES):
            arrays = {"frames": np.full((60 + index, 256), seq, np.int32)}
            store.put_stage(f"st-{seq}-{name}", name, arrays, {"seq": seq})
            stages[name] = f"st-{seq}-{name}"
        store.put_avatar("av", {"stages": stages, "seq": seq})
        wait_for_reads([reads])  # the reader reads between growths (an event, not a sleep)
    final.value = seq
    done.set()


def test_map_growth_in_writer_is_transparent_to_reader(tmp_path):
    path = str(tmp_path / "store")
    created = Store(path, map_size=TINY)
    created.close()
    ctx = mp.get_context("spawn")
    ready, done, final, results = ctx.Semaphore(0), ctx.Event(), ctx.RawValue("i", 0), ctx.Queue()
    count = ctx.RawValue("q", 0)
    r = ctx.Process(target=growing_reader, args=(path, ready, done, final, count, results))
    w = ctx.Process(target=growing_writer, args=(path, ready, done, final, count))
    r.start()
    w.start()
    reads, seen, last, first_map, end_map, error = results.get(timeout=120)
    r.join(timeout=30)
    w.join(timeout=30)
    assert error is None, error
    assert w.exitcode == 0 and r.exitcode == 0
    assert first_map == TINY
    assert end_map > TINY, "the reader never needed the grown map"
    assert seen == last == 40
    assert reads >= 40  # at least one between each of the 40 writes, by construction
