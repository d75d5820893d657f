"""The pid lock, the heartbeat and what `hotplate status` prints from them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from watcher import health
from watcher.health import DaemonRunningError, Lock, describe, lock_held, write_heartbeat

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

HOLD = """
import sys, time
from pathlib import Path
from watcher.health import Lock
Lock(Path(sys.argv[1])).acquire({"what": "hotplate watch", "personas": "/srv/p", "started": time.time()})
print("locked", flush=True)
time.sleep(60)
"""


def hold_lock_in_child(cache):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(cache)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_lock_refuses_and_names_the_first(cache):
    proc = hold_lock_in_child(cache)
    try:
        assert lock_held(cache)
        with pytest.raises(DaemonRunningError) as err:
            Lock(cache).acquire({"what": "hotplate watch"})
        msg = str(err.value)
        assert f"pid {proc.pid}" in msg and "/srv/p" in msg and f"kill {proc.pid}" in msg
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_does_not_block(cache):
    proc = hold_lock_in_child(cache)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not lock_held(cache)
    lock = Lock(cache)
    lock.acquire({"what": "hotplate watch"})  # the stale file is no obstacle
    try:
        assert lock_held(cache)
    finally:
        lock.release()
    assert not lock_held(cache)


def beat(cache, **extra):
    record = {
        "pid": 4242,
        "started": time.time() - 3725,
        "personas": "/srv/personas",
        "mode": "inotify",
        "workers": 2,
        "settle": 2.0,
        "queue": {"running": 1, "waiting": 2, "settling": 3},
        "done": 41,
        "failed": 1,
        "retried": 2,
        "sources": {"hot": 41, "failed": 1, "queued": 2},
        "errors": [
            {
                "path": "ruby/red.mp4",
                "error": "NoFaceError: no face",
                "time": time.time() - 120,
                "attempts": 3,
                "final": True,
            }
        ],
        **extra,
    }
    write_heartbeat(cache, record)


def test_describe_not_running(cache):
    cache.mkdir()
    assert describe(cache) == ["watcher  not running (start it with `hotplate watch`)"]


def test_describe_running(cache):
    cache.mkdir()
    lock = Lock(cache)
    lock.acquire({"what": "hotplate watch"})
    try:
        beat(cache)
        text = "\n".join(describe(cache))
    finally:
        lock.release()
    assert "running, pid 4242, up 62 min, heartbeat 0 s ago" in text
    assert "/srv/personas (inotify, 2 workers, settle 2.0 s)" in text
    assert "queue 1 running, 2 waiting, 3 settling; jobs done 41, failed 1, retried 2" in text
    assert "sources  1 failed, 41 hot, 2 queued" in text
    assert "error    ruby/red.mp4: NoFaceError: no face (2 min ago, gave up)" in text


def test_describe_stale_and_stopped_and_unresponsive(cache):
    cache.mkdir()
    beat(cache)
    assert "not running: stale heartbeat from pid 4242" in describe(cache)[0]
    beat(cache, stopped=time.time())
    assert "stopped at" in describe(cache)[0] and "exited cleanly" in describe(cache)[0]
    lock = Lock(cache)
    lock.acquire({"what": "hotplate watch"})
    try:
        beat(cache)
        record = health.read_json(cache / health.HEARTBEAT_FILE)
        record["heartbeat"] = time.time() - 60
        health.write_json(cache / health.HEARTBEAT_FILE, record)
        assert "unresponsive: pid 4242" in describe(cache)[0]
    finally:
        lock.release()


def test_describe_last_sync(cache):
    cache.mkdir()
    health.write_json(
        cache / health.SYNC_FILE,
        {
            "time": time.time(),
            "hot": 3,
            "failed": 1,
            "unchanged": 7,
            "errors": [{"path": "ruby/x.png", "error": "ValueError: bad"}],
        },
    )
    lines = describe(cache)
    assert "3 became hot, 1 failed, 7 already hot" in lines[1]
    assert lines[2].strip() == "failed ruby/x.png: ValueError: bad"


def test_threads_writing_the_heartbeat_at_once_never_collide(cache):
    """Every writer takes its own temp name: with one name per pid, two threads of one
    process renamed each other's temp away (FileNotFoundError in os.replace)."""
    import threading

    cache.mkdir()
    start, errors = threading.Barrier(8), []

    def write(n: int) -> None:
        start.wait()
        try:
            for i in range(200):
                health.write_json(cache / "daemon.json", {"writer": n, "i": i})
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert health.read_json(cache / "daemon.json")["i"] == 199
    assert [p.name for p in cache.iterdir() if ".tmp" in p.name] == []
