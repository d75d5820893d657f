"""The job queue's bookkeeping, and the worker pool with real spawned processes."""

from __future__ import annotations

import time
from multiprocessing.connection import wait
from pathlib import Path

import pytest
import xxhash

from cachestore.keys import FileStat
from pipeline.precompile.recipe import Recipe
from watcher.jobs import JobQueue, Outcome, WorkerFatalError, WorkerPool, backoff_delay, exit_reason
from watcher.sources import stat_of

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

TEST_JOB = "tests.watcher.testjobs:record"
STAT = FileStat(1, 2, 3, 4, 5)
RECIPE = Recipe(max_frames=8)


def test_same_avatar_is_one_job():
    q = JobQueue()
    job, created = q.add("av1", "d1", None, "ruby/a.png", STAT)
    same, created2 = q.add("av1", "d1", None, "ann/copy.png", STAT)
    assert created and not created2 and same is job
    assert list(job.paths) == ["ruby/a.png", "ann/copy.png"]
    other, created3 = q.add("av2", "d2", None, "ruby/b.png", STAT)
    assert created3 and other.id == job.id + 1
    assert len(q) == 2 and q.next_ready(0) is job


def test_a_path_moves_to_its_new_content():
    q = JobQueue()
    old, _ = q.add("av1", "d1", None, "ruby/a.png", STAT)
    new, _ = q.add("av2", "d2", None, "ruby/a.png", STAT)  # the file changed
    assert "ruby/a.png" not in old.paths and list(q.jobs) == ["av2"]
    assert q.job_of("ruby/a.png") is new


def test_removing_the_last_path_drops_a_waiting_job_but_not_a_running_one():
    q = JobQueue()
    a, _ = q.add("av1", "d1", None, "ruby/a.png", STAT)
    b, _ = q.add("av2", "d2", None, "ruby/b.png", STAT)
    q.start(b, "ruby/b.png", 0)
    assert q.remove_path("ruby/a.png") is a and "av1" not in q.jobs
    assert q.remove_path("ruby/b.png") is b and "av2" in q.jobs  # its worker has it
    assert q.running == [b] and q.next_ready(0) is None


def test_defer_and_backoff():
    q = JobQueue()
    job, _ = q.add("av1", "d1", None, "ruby/a.png", STAT)
    q.start(job, "ruby/a.png", 0)
    q.defer(job, until=10.0, error="boom")
    assert q.next_ready(9.9) is None and q.next_ready_at() == 10.0
    assert q.next_ready(10.0) is job
    assert [backoff_delay(n, 5.0) for n in (1, 2, 3)] == [5.0, 10.0, 20.0]


def test_exit_reason():
    assert exit_reason(-9) == "was killed by SIGKILL"
    assert exit_reason(-6) == "was killed by SIGABRT"
    assert exit_reason(3) == "exited with status 3"


def collect(pool: WorkerPool, n: int, timeout: float = 60) -> list[Outcome]:
    out: list[Outcome] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        wait(pool.waitables(), 0.2)
        out.extend(pool.poll())
    assert len(out) >= n, f"only {len(out)} of {n} outcomes"
    return out


def run_jobs(pool: WorkerPool, q: JobQueue, files: list[Path]) -> dict[str, Outcome]:
    for f in files:
        q.add(f.name, "", RECIPE, f.name, stat_of(f))
    results: dict[str, Outcome] = {}
    deadline = time.monotonic() + 60
    while len(results) < len(files) and time.monotonic() < deadline:
        while (w := pool.idle()) and (job := q.next_ready(time.monotonic())):
            q.start(job, job.avatar, 0)
            pool.submit(
                w,
                job,
                files[[f.name for f in files].index(job.avatar)],
                next(iter(job.paths.values())),
            )
        wait(pool.waitables(), 0.2)
        for o in pool.poll():
            results[o.job.avatar] = o
            q.finish(o.job)
    return results


def test_pool_survives_raising_crashing_and_aborting_jobs(tmp_path, cache, joblog):
    files = []
    for name in ("ok1.png", "boom.png", "die.png", "abort.png", "ok2.png"):
        f = tmp_path / name
        f.write_bytes(name.encode() * 100)
        files.append(f)
    pool = WorkerPool(2, cache, TEST_JOB)
    pool.start()
    try:
        results = run_jobs(pool, JobQueue(), files)
    finally:
        pool.stop(grace=1)
    assert results["ok1.png"].status == "ok"
    assert results["ok1.png"].detail["digest"] == xxhash.xxh3_128_hexdigest(files[0].read_bytes())
    assert results["ok2.png"].status == "ok"
    assert results["boom.png"].status == "error"
    assert "ValueError: boom.png is not a face" in results["boom.png"].detail
    assert results["die.png"].status == "died" and "SIGKILL" in results["die.png"].detail
    assert results["abort.png"].status == "died" and "SIGABRT" in results["abort.png"].detail
    assert pool.started == 4  # two replacements


def test_workers_live_across_jobs(tmp_path, cache, joblog):
    from tests.watcher.testjobs import read_joblog

    files = [tmp_path / f"f{i}.png" for i in range(4)]
    for i, f in enumerate(files):
        f.write_bytes(bytes([i]) * 10)
    pool = WorkerPool(1, cache, TEST_JOB)
    pool.start()
    try:
        results = run_jobs(pool, JobQueue(), files)
    finally:
        pool.stop(grace=1)
    assert all(o.status == "ok" for o in results.values())
    assert len({r["pid"] for r in read_joblog(joblog)}) == 1 and pool.started == 1


def test_a_job_function_that_does_not_load_is_fatal(cache):
    pool = WorkerPool(1, cache, "tests.watcher.testjobs:no_such_function")
    pool.start()
    try:
        with pytest.raises(WorkerFatalError, match="no_such_function"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                wait(pool.waitables(), 0.2)
                pool.poll()
    finally:
        pool.stop(grace=0)


def test_stop_abandons_a_running_job(tmp_path, cache, joblog, monkeypatch):
    monkeypatch.setenv("HOTPLATE_TEST_SLOW", "60")
    f = tmp_path / "slow.png"
    f.write_bytes(b"s")
    pool = WorkerPool(1, cache, TEST_JOB)
    pool.start()
    q = JobQueue()
    job, _ = q.add("av", "", RECIPE, "slow.png", stat_of(f))
    pool.submit(pool.idle(), job, f, stat_of(f))
    from tests.watcher.testjobs import read_joblog

    deadline = time.monotonic() + 30
    while not read_joblog(joblog) and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    assert pool.stop(grace=0.5) == []
    # abandoned, not waited for: the job would take 60 s
    assert time.monotonic() - start < 30
    assert pool.workers == []


KEEP = """
from pipeline.nets.modelcache import kept
from pipeline.nets.landmarks import load_landmarker
a = kept("landmarks", "dlib", None, lambda: load_landmarker("dlib", None))
b = kept("landmarks", "dlib", None, lambda: load_landmarker("dlib", None))
try:
    kept("landmarks", "nope", None, lambda: load_landmarker("nope", None))
except ValueError as exc:
    print("unknown:", exc)
print(a is b, type(a).__name__)
"""


def test_models_are_kept_across_jobs():
    import subprocess
    import sys

    from tests.watcher.helpers import ROOT

    out = subprocess.run(
        [sys.executable, "-c", KEEP], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("unknown:") and "nope" in lines[0]
    assert lines[1] == "True DlibLandmarker"
