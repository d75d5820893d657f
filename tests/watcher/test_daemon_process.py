"""`hotplate watch` as a real process: kill -9, SIGTERM/SIGINT, a second daemon."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cachestore.store import open_store
from cachestore.verify import verify
from tests.watcher.helpers import (
    TEST_JOB,
    DaemonProcess,
    cli,
    source_table,
    wait_for,
    write_loop,
)
from watcher.health import describe
from watcher.sources import HOT, QUEUED, RUNNING


def dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (a container's pid 1 may not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X")


def stage_count(cache: Path) -> int:
    """Stage manifests in the store now (0 before the daemon has created it)."""
    from cachestore.errors import StoreError

    if not (cache / "data.mdb").exists():
        return 0
    try:
        return len(open_store(cache, readonly=True).items("stage"))
    except StoreError:
        return 0


def verified(cache: Path) -> int:
    checked, problems = verify(open_store(cache))
    assert problems == [], [str(p) for p in problems]
    return checked


@pytest.mark.slow
def test_kill_9_mid_precompile_then_restart(personas, cache):
    write_loop(personas / "ann" / "red.mp4", n_frames=40)
    env = {"HOTPLATE_MAX_FRAMES": "40"}
    first = DaemonProcess(personas, cache, "--settle", "0.3", env=env).start()
    try:
        (start,) = wait_for(lambda: first.events("job-start"), 60, "the precompile to start")
        # mid-precompile: its first stage is in the store, the avatar is not (a condition,
        # not a sleep); four more stages over 40 frames are still to come
        wait_for(lambda: stage_count(cache) > 0, 60, "the first stage to be stored")
        assert not first.events("job-done"), "the precompile ended before the kill"
        first.send(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        wait_for(lambda: dead(start["worker"]), 10, "the worker to die with the daemon")
    finally:
        first.kill()
    verified(cache)
    assert source_table(cache, personas)["ann/red.mp4"]["state"] == RUNNING  # as it was left
    assert "stale heartbeat" in describe(cache)[0]

    second = DaemonProcess(personas, cache, "--settle", "0.3", env=env).start()
    try:
        wait_for(lambda: second.events("job-done"), 120, "the precompile to finish")
        second.send(signal.SIGTERM)
        assert second.wait(10) == 0
    finally:
        second.kill()
    assert verified(cache) > 0
    row = source_table(cache, personas)["ann/red.mp4"]
    assert row["state"] == HOT and open_store(cache).get_avatar(row["avatar"]) is not None


@pytest.mark.slow
def test_sigterm_during_a_real_precompile(personas, cache):
    write_loop(personas / "ann" / "red.mp4", n_frames=40)
    d = DaemonProcess(personas, cache, "--settle", "0.3", env={"HOTPLATE_MAX_FRAMES": "40"}).start()
    try:
        wait_for(lambda: d.events("job-start"), 60, "the precompile to start")
        wait_for(lambda: stage_count(cache) > 0, 60, "the first stage to be stored")
        d.send(signal.SIGTERM)
        assert d.wait(30) == 0  # the job is abandoned, not waited for
    finally:
        d.kill()
    verified(cache)
    assert "stopped at" in describe(cache)[0]
    assert source_table(cache, personas)["ann/red.mp4"]["state"] in (HOT, QUEUED)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_abandons_a_long_job_within_seconds(personas, cache, joblog, sig):
    (personas / "ann").mkdir()
    env = {"HOTPLATE_WATCH_JOB": TEST_JOB, "HOTPLATE_TEST_SLOW": "60"}
    d = DaemonProcess(personas, cache, "--settle", "0.2", env=env).start()
    try:
        (personas / "ann" / "slow.png").write_bytes(b"s" * 1000)
        (start,) = wait_for(lambda: d.events("job-start"), 30, "the job to start")
        d.send(sig)
        assert d.wait(30) == 0  # abandoned: the job itself would take 60 s
        wait_for(lambda: dead(start["worker"]), 30, "the worker to be stopped")
    finally:
        d.kill()
    row = source_table(cache, personas)["ann/slow.png"]
    assert row["state"] == QUEUED and "abandoned" in row["error"]
    assert any(r["event"] == "stop" and r["path"] == "ann/slow.png" for r in d.records)


def test_a_second_daemon_refuses_and_names_the_first(personas, cache, joblog):
    env = {"HOTPLATE_WATCH_JOB": TEST_JOB}
    first = DaemonProcess(personas, cache, env=env).start()
    try:
        for command in (["watch"], ["sync"]):
            second = cli(personas, cache, *command, env=first.env)
            assert second.returncode == 1
            assert f"pid {first.proc.pid}" in second.stderr and str(personas) in second.stderr
        assert "running, pid" in describe(cache)[0]
        first.send(signal.SIGTERM)
        assert first.wait(10) == 0
    finally:
        first.kill()
