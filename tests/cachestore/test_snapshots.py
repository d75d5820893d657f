"""Snapshot copies are cleaned by their lock, not their pid: a live copy held in another
PID namespace (containers sharing one cache) is kept, a killed holder's copy goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cachestore.hashcache import SNAPSHOTS, snapshot
from cachestore.store import forget_store, open_store
from testkit.preconditions import require
from tests.cachestore.test_map_growth import ROOT

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

# Takes a snapshot of argv[2] in the store at argv[1] (which first cleans the orphans),
# says where its copy is, and holds it until stdin closes.
HOLDER = """
import sys
from cachestore.hashcache import snapshot
from cachestore.store import open_store
with snapshot(open_store(sys.argv[1]), sys.argv[2]) as (copy, digest):
    print(copy, flush=True)
    sys.stdin.read()
"""


def unshare_works() -> bool:
    try:
        probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
        return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def hold(cache: Path, source: Path, *prefix: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", HOLDER, str(cache), str(source)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    return proc, Path(proc.stdout.readline().strip())


@pytest.fixture
def world(tmp_path):
    source = tmp_path / "take.mp4"
    source.write_bytes(os.urandom(1 << 20))
    yield tmp_path / "cache", source
    forget_store(tmp_path / "cache")


def test_a_live_snapshot_is_kept_when_cleaned_from_another_pid_namespace(world):
    """The cleaner runs in a new PID namespace (as a container would): it cannot see this
    process's pid in its /proc, yet this process's copy is live and must stay."""
    require(os.geteuid() == 0 and unshare_works(), "unshare --pid needs root (CI runs as root)")
    cache, source = world
    with snapshot(open_store(cache), source) as (copy, digest):
        holder, theirs = hold(cache, source, "unshare", "--pid", "--fork", "--mount-proc")
        try:
            assert theirs.exists() and theirs != copy
            assert copy.exists(), "a live snapshot was removed by a cleaner that saw no pid"
        finally:
            holder.communicate(timeout=60)
        assert copy.read_bytes() == source.read_bytes()
    assert not copy.exists() and not theirs.exists()


def test_a_killed_holders_snapshot_is_removed_by_the_next(world):
    cache, source = world
    holder, theirs = hold(cache, source)
    assert theirs.exists()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert theirs.exists()  # a kill -9 leaves the copy; only the kernel's lock went
    with snapshot(open_store(cache), source) as (copy, digest):
        assert not theirs.exists() and copy.exists()
    assert [p.name for p in (cache / SNAPSHOTS).iterdir()] == []
