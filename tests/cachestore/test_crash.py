"""kill -9 of a writer at random points never leaves the store half-written.

A child process loops: write three stages of several blobs, an avatar manifest naming
them, overwrite a "latest" avatar, and every few avatars gc what it no longer roots.
The parent SIGKILLs it after a random 10-300 ms (mid-put, mid-commit, mid-gc or
mid-growth of the map, since the child starts from a tiny map), then reopens the store
and checks it: LMDB opens, `verify` finds nothing, every manifest names only what
exists, every avatar the child reported committed is there, and a new write goes
through (a writer killed while holding the write lock must not wedge the next one).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from cachestore.gc import collect
from cachestore.store import forget_store, open_store
from cachestore.verify import verify

KILLS = 30
STAGES = ("track", "crops", "masks")
KEEP = 4  # the child's gc roots its last KEEP avatars


def write_avatar(store, seq: int, rng: np.random.Generator) -> None:
    """Three stages of three random blobs (16-96 KiB each), then the avatar naming them."""
    stages = {}
    for name in STAGES:
        arrays = {
            f"a{i}": rng.integers(0, 256, int(rng.integers(16, 96)) << 10, dtype=np.uint8)
            for i in range(3)
        }
        key = f"stage-{seq}-{name}"
        store.put_stage(key, name, arrays, {"seq": seq})
        stages[name] = key
    record = {"stages": stages, "frames": 3, "seq": seq}
    store.put_avatar(f"av-{seq}", record)
    store.put_avatar("av-latest", record)


def writer(path: str, start: int, opened, committed) -> None:
    """Runs until killed. `committed` is the last seq whose avatar is durable."""
    store = open_store(path, map_size=256 << 10)  # tiny: growth happens under the kills too
    opened.value = 1
    rng = np.random.default_rng(start)
    seq = start
    while True:
        write_avatar(store, seq, rng)
        committed.value = seq
        store.put("source", f"ruby/clip-{seq % 7}.mp4", {"digest": f"d{seq}", "seen": time.time()})
        store.touch(f"av-{seq}")
        if seq % 3 == 0:
            roots = {f"av-{s}" for s in range(seq - KEEP + 1, seq + 1)} | {"av-latest"}
            collect(store, roots, grace=0)
        seq += 1


def check_store(path: Path, last_committed: int) -> int:
    """Open, verify, walk every manifest; returns the number of avatars."""
    store = open_store(path)
    try:
        checked, problems = verify(store)
        assert problems == [], [str(p) for p in problems]
        avatars = dict(store.items("avatar"))
        for key, rec in store.items("stage"):
            assert store.load_arrays(key) is not None, f"stage {key} unreadable"
            assert set(rec["blobs"]) == {"a0", "a1", "a2"}
        for key, rec in avatars.items():
            assert set(rec["stages"]) == set(STAGES)
            assert store.get_avatar(key) is not None, f"avatar {key} names a missing stage"
            assert all(store.get_stage(s).meta["seq"] == rec["seq"] for s in rec["stages"].values())
        if last_committed >= 0:
            assert f"av-{last_committed}" in avatars, "a committed avatar was lost"
            assert avatars["av-latest"]["seq"] >= last_committed
        store.put("meta", "crash-check", last_committed)  # the write lock is not wedged
        return len(avatars)
    finally:
        forget_store(path)


@pytest.mark.slow
def test_kill_minus_nine_at_random_points(tmp_path):
    path = tmp_path / "store"
    ctx = mp.get_context("spawn")
    rng = random.Random(1234)
    committed_total = 0
    for i in range(KILLS):
        opened, committed = ctx.RawValue("i", 0), ctx.RawValue("q", -1)
        child = ctx.Process(target=writer, args=(str(path), i * 100_000, opened, committed))
        child.start()
        deadline = time.monotonic() + 30
        while not opened.value:
            assert child.is_alive(), f"writer {i} died with exit code {child.exitcode}"
            assert time.monotonic() < deadline, "writer never opened the store"
            time.sleep(0.002)
        time.sleep(rng.uniform(0.010, 0.300))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL, "writer ended before it was killed"
        last = committed.value
        committed_total += last - i * 100_000 + 1 if last >= 0 else 0
        assert check_store(path, last) >= (1 if last >= 0 else 0)
    # The kills landed while real work was going on, not only before the first write.
    assert committed_total >= KILLS
