"""Render leases with real processes: a live lease is a root gc keeps whatever the size
cap and compact refuses; a lease of a process killed with -9 is ignored and removed."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest

from cachestore.compact import compact
from cachestore.errors import StoreBusyError
from cachestore.gc import collect
from cachestore.leases import LEASES, Lease, live_leases
from cachestore.store import forget_store, open_store
from tests.hotplate.many_processes import as_json, clean_env, hotplate, read_line

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
