"""`hotplate sync`, and the daemon's reconcile against it, with the real precompile."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cachestore.store import forget_store, open_store
from tests.watcher.helpers import (
    TEST_JOB,
    ThreadDaemon,
    cli,
    source_table,
    write_loop,
    write_still,
)
from watcher.health import describe

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


@pytest.mark.slow
def test_sync_makes_everything_hot_once(personas, cache):
    write_still(personas / "ann" / "portrait.png", seed=1)
    write_still(personas / "ann" / "red.png", seed=2)
    write_loop(personas / "ann" / "red" / "M1.mp4", seed=3)
    (personas / "bob").mkdir()
    shutil.copy(personas / "ann" / "portrait.png", personas / "bob" / "portrait.png")
    first = cli(personas, cache, "sync")
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].split() == ["persona", "attire", "motion", "state", "time", "file"]
    table = {line.split()[-1]: line.split() for line in lines[2:-1]}
    assert table["ann/red/M1.mp4"][:4] == ["ann", "red", "M1", "hot"]
    assert table["bob/portrait.png"][:4] == ["bob", "default", "default", "hot"]
    assert lines[-1].startswith("4 became hot, 0 failed, 0 already hot")
    # what the renderer resolves is what sync made hot
    resolved = cli(personas, cache, "resolve", "--persona", "ann", "--attire", "red")
    assert "state    hot" in resolved.stdout
    again = cli(personas, cache, "sync")
    assert again.returncode == 0
    assert again.stdout.strip().endswith(f"0 became hot, 0 failed, 4 already hot in {personas}")
    assert "sync     last run" in "\n".join(describe(cache))


def test_sync_exits_non_zero_when_something_failed(personas, cache, joblog):
    (personas / "ann").mkdir()
    (personas / "ann" / "boom.png").write_bytes(b"b" * 100)
    (personas / "ann" / "fine.png").write_bytes(b"f" * 100)
    env = {"HOTPLATE_WATCH_JOB": TEST_JOB}
    run = cli(personas, cache, "sync", "--retries", "2", "--backoff", "0.1", env=env)
    assert run.returncode == 1
    assert "failed ann/boom.png: ValueError: boom.png is not a face" in run.stderr
    assert "1 became hot, 1 failed" in run.stdout
    status = "\n".join(describe(cache))
    assert "1 became hot, 1 failed" in status and "ann/boom.png" in status
    # unchanged, it is not retried, but still reported
    again = cli(personas, cache, "sync", env=env)
    assert again.returncode == 1 and "failed before" in again.stderr
    retried = cli(personas, cache, "sync", "--retry-failed", "--retries", "1", env=env)
    assert retried.returncode == 1 and "failed ann/boom.png" in retried.stderr


@pytest.mark.slow
def test_changes_while_stopped_reconcile_to_what_a_fresh_sync_makes(personas, cache, tmp_path):
    write_still(personas / "ann" / "portrait.png", seed=1)
    write_still(personas / "ann" / "red.png", seed=2)
    (personas / "bob").mkdir()
    shutil.copy(personas / "ann" / "portrait.png", personas / "bob" / "portrait.png")
    write_loop(personas / "bob" / "blue" / "M1.mp4", seed=3)
    write_still(personas / "cid" / "old.png", seed=4)
    with ThreadDaemon(personas, cache) as d:
        d.wait_idle(quiet=0.5)
    assert len(d.events("job-done")) == 4

    # while it is down: add, modify, rename, delete
    write_still(personas / "dan" / "portrait.png", seed=5)
    write_still(personas / "ann" / "red.png", seed=6)
    os.rename(personas / "bob" / "blue" / "M1.mp4", personas / "bob" / "blue" / "M2.mp4")
    os.unlink(personas / "cid" / "old.png")

    with ThreadDaemon(personas, cache) as d:
        d.wait_idle(quiet=0.5)
    (scan,) = d.events("reconcile")
    assert (scan["gone"], scan["moved"]) == (2, 1)
    assert sorted(r["path"] for r in d.events("job-start")) == ["ann/red.png", "dan/portrait.png"]
    assert [r["path"] for r in d.events("hot")] == ["bob/blue/M2.mp4"]  # renamed: no precompile

    fresh = tmp_path / "fresh"
    assert cli(personas, fresh, "sync").returncode == 0

    def view(store_dir: Path) -> dict:
        rows = source_table(store_dir, personas)
        store = open_store(store_dir)
        return {
            rel: (r["digest"], r["avatar"], r["state"], store.get_avatar(r["avatar"]) is not None)
            for rel, r in rows.items()
        }

    try:
        assert view(cache) == view(fresh)
        assert sorted(view(cache)) == [
            "ann/portrait.png",
            "ann/red.png",
            "bob/blue/M2.mp4",
            "bob/portrait.png",
            "dan/portrait.png",
        ]
    finally:
        forget_store(fresh)
