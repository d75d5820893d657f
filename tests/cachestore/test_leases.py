"""Render leases with real processes: a live lease is a root gc keeps whatever the size
cap and compact refuses; a lease of a process killed with -9 is ignored and removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from cachestore.compact import compact
from cachestore.errors import StoreBusyError
from cachestore.gc import collect
from cachestore.leases import BARRIER, LEASES, Lease, live_leases
from cachestore.store import forget_store, open_store
from tests.hotplate.many_processes import as_json, clean_env, hotplate, read_line

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

LEASER = """
import sys
from cachestore.leases import Lease
lease = Lease(sys.argv[1], sys.argv[2:])
print("leased", flush=True)
sys.stdin.read()
"""


def put_avatar(store, key: str, seed: int) -> None:
    arrays = {"x": np.random.default_rng(seed).random(4096, dtype=np.float32)}
    store.put_stage(f"stage-{key}", "decode", arrays, {})
    store.put_avatar(key, {"stages": {"decode": f"stage-{key}"}})


@pytest.fixture
def cache(tmp_path):
    path = tmp_path / "cache"
    store = open_store(path)
    for i, key in enumerate(("leased", "free")):
        put_avatar(store, key, i)
    yield path
    forget_store(path)


def start_leaser(cache, *keys: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", LEASER, str(cache), *keys],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(cache.parent),
    )
    assert read_line(proc.stdout, 120) == "leased"
    return proc


def avatars(cache) -> set[str]:
    return {k for k, _ in open_store(cache).items("avatar")}


def test_a_live_lease_is_kept_by_gc_whatever_the_size_cap(cache):
    leaser = start_leaser(cache, "leased")
    try:
        (info,) = live_leases(cache)
        assert info.holder.pid == leaser.pid and info.keys == ("leased",)
        plan = collect(open_store(cache), roots=[], grace=0, max_size=1)
        assert "avatar:leased" not in plan.freed and "avatar:free" in plan.freed
        assert avatars(cache) == {"leased"}
    finally:
        leaser.kill()
        leaser.wait(timeout=60)
    collect(open_store(cache), roots=[], grace=0, max_size=1)  # the lease has gone with it
    assert avatars(cache) == set()


def test_a_killed_holders_lease_is_ignored_and_removed(cache):
    leaser = start_leaser(cache, "leased")
    (lease_file,) = (cache / LEASES).glob("*.lease")
    leaser.send_signal(signal.SIGKILL)
    leaser.wait(timeout=60)
    assert lease_file.exists()  # a kill -9 leaves its file; only the kernel's lock went

    plan = collect(open_store(cache), roots=[], grace=0, max_size=1)
    assert {"avatar:leased", "avatar:free"} <= set(plan.freed)
    assert not lease_file.exists() and live_leases(cache) == []


def test_compact_refuses_while_a_lease_is_live_naming_its_holder(cache):
    leaser = start_leaser(cache, "leased")
    try:
        with pytest.raises(StoreBusyError, match=f"pid {leaser.pid}"):
            compact(cache)
    finally:
        leaser.kill()
        leaser.wait(timeout=60)
    before, after = compact(cache)
    assert after <= before


def test_status_lists_live_leases_and_a_released_lease_is_gone(cache):
    lease = Lease(cache, ["leased", "free"])
    try:
        facts = as_json(hotplate(cache.parent, "status", "--json"))
        (listed,) = facts["leases"]
        assert listed["keys"] == ["leased", "free"] and listed["pid"] == lease.holder.pid
        text = hotplate(cache.parent, "status")
        assert f"lease    pid {lease.holder.pid}" in text.stdout
    finally:
        lease.release()
    assert live_leases(cache) == [] and not list((cache / LEASES).glob("*.lease"))


# Holds LMDB's write lock until told: a gc that has listed the leases then waits for it
# to commit, with the barrier held, at a moment the test chooses.
HOLD_WRITER = """
import sys
from cachestore.store import open_store
txn = open_store(sys.argv[1]).env.begin(write=True)
print("holding", flush=True)
sys.stdin.readline()
txn.abort()
"""


def waiting_for_flock(path) -> bool:
    """True when some process is blocked in flock() on `path` (a `->` line in /proc/locks)."""
    inode = f":{os.stat(path).st_ino} "
    with open("/proc/locks") as locks:
        return any("->" in line and inode in line for line in locks)


def until(check, what: str, deadline: float = 120.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_lease_taken_while_gc_runs_waits_for_its_commit(cache):
    """gc has listed the leases and waits to commit (another process holds LMDB's write
    lock). A render that leases its avatar now must not find it hot and then lose it: the
    barrier holds the new lease back until gc has committed, so the render finds it cold
    (and would rebuild it), never hot-then-deleted."""
    dead = cache / LEASES / "zzzz-dead.lease"  # unlocked: gc's listing removes it, last
    dead.parent.mkdir(exist_ok=True)
    dead.write_text("{}")
    writer = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITER, str(cache)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(cache.parent),
    )
    store = open_store(cache)
    plans, seen = [], []
    try:
        assert read_line(writer.stdout, 120) == "holding"
        gc = threading.Thread(target=lambda: plans.append(collect(store, roots=[], grace=0)))
        gc.start()
        until(lambda: not dead.exists(), "gc to list the leases")  # now it waits to commit

        def render() -> None:
            with Lease(cache, ["leased"]):
                seen.append(store.get_avatar("leased") is not None)

        reader = threading.Thread(target=render)
        reader.start()
        barrier = cache / LEASES / BARRIER
        until(lambda: seen or waiting_for_flock(barrier), "the render to look or to wait")
        writer.stdin.write("\n")
        writer.stdin.flush()
        gc.join(timeout=120)
        reader.join(timeout=120)
    finally:
        writer.kill()
        writer.wait(timeout=60)
    (plan,) = plans
    found, kept = seen[0], store.get_avatar("leased") is not None
    assert not (found and not kept), "the render found its avatar hot, then gc deleted it"
    assert not found and "avatar:leased" in plan.freed  # it waited, then found it cold
