"""The daemon end to end on real files, real inotify events and real worker processes.

The workers run tests.watcher.testjobs:record (it hashes the bytes it was given and
logs the call) so that every job is counted exactly; test_reconcile_e2e.py runs the
real precompile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import xxhash

from testkit.preconditions import require
from tests.watcher.helpers import TEST_JOB, ThreadDaemon, source_table, wait_for
from tests.watcher.testjobs import read_joblog
from watcher.events import OVERFLOW, Change
from watcher.health import describe
from watcher.sources import FAILED, HOT


def done_jobs(joblog: Path) -> list[dict]:
    return [r for r in read_joblog(joblog) if r["event"] == "done"]


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def blob(seed: int, size: int = 200_000) -> bytes:
    """Distinct bytes per call (random), media-sized."""
    return (seed.to_bytes(4, "little") + os.urandom(16)) * (size // 20)


def daemon(personas: Path, cache: Path, **config) -> ThreadDaemon:
    config.setdefault("job", TEST_JOB)
    return ThreadDaemon(personas, cache, **config)


def test_slow_chunked_copy_is_one_job_after_it_finished(personas, cache, joblog):
    """100 MB written in chunks over ~2 s: one job, after the close, on the final bytes."""
    chunk = os.urandom(2 << 20)
    target = personas / "ann" / "big.mp4"
    target.parent.mkdir()
    with daemon(personas, cache, settle=0.3) as d:
        with open(target, "wb") as f:
            for i in range(50):
                f.write(chunk[i:] + chunk[:i])
                f.flush()
                time.sleep(0.04)
        copied = time.time()
        d.wait_idle()
    jobs = done_jobs(joblog)
    assert len(jobs) == 1, jobs
    assert jobs[0]["path"].endswith("ann/big.mp4")
    assert jobs[0]["start"] >= copied
    assert jobs[0]["digest"] == xxhash.xxh3_128_hexdigest(target.read_bytes())
    assert len(read_joblog(joblog)) == 2  # one start, one done: nothing ran on a partial file
    assert source_table(cache, personas)["ann/big.mp4"]["state"] == HOT


def rsync_tree(src: Path) -> dict[str, bytes]:
    """Three personas, eight files, five distinct contents."""
    a, b, c, d, e = (blob(i, 2_000_000) for i in range(5))
    files = {
        "ann/portrait.png": a,
        "ann/red.mp4": b,
        "bob/portrait.png": a,  # same bytes as ann's portrait
        "bob/blue/M1.mp4": c,
        "bob/blue/M2.mp4": c,
        "cid/portrait.jpg": d,
        "cid/green.webp": e,
        "cid/notes.txt": b"not media",
    }
    for rel, data in files.items():
        write_bytes(src / rel, data)
    return files


@pytest.mark.parametrize("inplace", [False, True], ids=["rsync", "rsync-inplace"])
def test_rsync_of_several_personas(personas, cache, joblog, tmp_path, inplace):
    require(shutil.which("rsync"), "rsync is not installed (`just setup` installs it with apt-get)")
    files = rsync_tree(tmp_path / "src")
    with daemon(personas, cache) as d:
        args = [
            "rsync",
            "-a",
            *(["--inplace"] if inplace else []),
            f"{tmp_path / 'src'}/",
            f"{personas}/",
        ]
        subprocess.run(args, check=True)
        d.wait_idle()
        ignored = [r["path"] for r in d.events("ignore")]
    jobs = done_jobs(joblog)
    media = {rel: data for rel, data in files.items() if not rel.endswith(".txt")}
    distinct = {xxhash.xxh3_128_hexdigest(data) for data in media.values()}
    assert len(jobs) == len(distinct) == 5
    assert {j["digest"] for j in jobs} == distinct
    assert all("/." not in j["path"] for j in jobs)  # never an rsync temp name
    rows = source_table(cache, personas)
    assert sorted(rows) == sorted(media) and {r["state"] for r in rows.values()} == {HOT}
    assert rows["ann/portrait.png"]["avatar"] == rows["bob/portrait.png"]["avatar"]
    assert "cid/notes.txt" in ignored
    if not inplace:
        assert any(Path(p).name.startswith(".") for p in ignored)  # rsync's temp files


def test_editor_atomic_save(personas, cache, joblog):
    red = write_bytes(personas / "ann" / "red.png", blob(1))
    with daemon(personas, cache) as d:
        d.wait_idle()
        assert len(done_jobs(joblog)) == 1
        # save over an existing attire: write a temp beside it, then rename over it
        tmp = write_bytes(personas / "ann" / ".red.png.swp", blob(2))
        os.replace(tmp, red)
        # and a new attire saved the same way
        tmp = write_bytes(personas / "ann" / "blue.png.tmp", blob(3))
        os.replace(tmp, personas / "ann" / "blue.png")
        d.wait_idle()
    jobs = done_jobs(joblog)
    assert len(jobs) == 3
    saved = {
        xxhash.xxh3_128_hexdigest(p.read_bytes()) for p in (red, personas / "ann" / "blue.png")
    }
    assert {j["digest"] for j in jobs[1:]} == saved
    assert {Path(j["path"]).name for j in jobs} == {"red.png", "blue.png"}
    rows = source_table(cache, personas)
    assert sorted(rows) == ["ann/blue.png", "ann/red.png"]
    assert rows["ann/red.png"]["digest"] == xxhash.xxh3_128_hexdigest(red.read_bytes())


def test_identical_files_are_one_job(personas, cache, joblog):
    data = blob(7)
    with daemon(personas, cache) as d:
        write_bytes(personas / "ann" / "a.png", data)
        write_bytes(personas / "bob" / "b.png", data)
        write_bytes(personas / "bob" / "c.png", data)
        d.wait_idle()
        queued = d.events("queued")
    assert len(done_jobs(joblog)) == 1
    # a join says so in a field (what `hotplate sync`'s progress counts by), not in its text
    assert len([r for r in queued if "same_as" not in r]) == 1
    assert all(r["same_as"] in {"ann/a.png", "bob/b.png", "bob/c.png"} for r in queued[1:])
    rows = source_table(cache, personas)
    assert len({r["avatar"] for r in rows.values()}) == 1 and len(rows) == 3
    assert {r["state"] for r in rows.values()} == {HOT}


def test_renames_cost_no_job(personas, cache, joblog):
    write_bytes(personas / "ann" / "red.png", blob(1))
    write_bytes(personas / "ann" / "blue" / "M1.mp4", blob(2))
    with daemon(personas, cache) as d:
        d.wait_idle()
        assert len(done_jobs(joblog)) == 2
        os.rename(personas / "ann" / "red.png", personas / "ann" / "crimson.png")
        os.rename(personas / "ann", personas / "anna")  # the whole persona
        d.wait_idle()
        moved = d.events("moved")
    assert len(done_jobs(joblog)) == 2  # nothing precompiled again
    assert moved  # carried over without rehashing
    rows = source_table(cache, personas)
    assert sorted(rows) == ["anna/blue/M1.mp4", "anna/crimson.png"]
    assert {r["state"] for r in rows.values()} == {HOT}


def test_a_folder_moved_in_is_ready_without_waiting_for_closes(personas, cache, joblog, tmp_path):
    outside = tmp_path / "incoming" / "dan"
    write_bytes(outside / "portrait.png", blob(4))
    write_bytes(outside / "red" / "M1.mp4", blob(5))
    with daemon(personas, cache, settle=0.3, open_grace=10) as d:
        moved = time.time()
        os.rename(outside, personas / "dan")
        d.wait_idle(quiet=0.5)
    jobs = done_jobs(joblog)
    assert len(jobs) == 2
    assert max(j["start"] for j in jobs) - moved < 5  # not the 10 s open grace


def test_deletes_drop_rows(personas, cache, joblog):
    write_bytes(personas / "ann" / "red.png", blob(1))
    write_bytes(personas / "bob" / "red.png", blob(2))
    with daemon(personas, cache) as d:
        d.wait_idle()
        os.unlink(personas / "ann" / "red.png")
        shutil.rmtree(personas / "bob")
        d.wait_idle()
    assert source_table(cache, personas) == {}


def test_failures_are_retried_then_reported_and_the_daemon_stays_up(personas, cache, joblog):
    write_bytes(personas / "ann" / "boom.png", blob(1))
    write_bytes(personas / "ann" / "die.png", blob(2))
    write_bytes(personas / "ann" / "abort.png", blob(3))
    write_bytes(personas / "ann" / "fine.png", blob(4))
    # rescans every 0.3 s: "not retried" is then checked after a rescan, not after a sleep
    with daemon(personas, cache, retries=2, backoff=0.1, workers=2, rescan=0.005) as d:
        d.wait_idle(quiet=0.5)
        write_bytes(personas / "bob" / "later.png", blob(5))  # still served after the crashes
        d.wait_idle(quiet=0.5)
        d.daemon.heartbeat()
        status = "\n".join(describe(cache))
        rows = source_table(cache, personas)
        assert rows["ann/fine.png"]["state"] == HOT and rows["bob/later.png"]["state"] == HOT
        for name, text in (
            ("boom", "ValueError: boom.png is not a face"),
            ("die", "SIGKILL"),
            ("abort", "SIGABRT"),
        ):
            row = rows[f"ann/{name}.png"]
            assert row["state"] == FAILED and row["attempts"] == 2 and text in row["error"]
            assert f"ann/{name}.png" in status and "gave up" in status
        assert "failed 3" in status
        starts, scans = len(d.events("job-start")), len(d.events("reconcile"))
        # failed files are not retried for ever: two rescans later, still no new attempt ...
        wait_for(lambda: len(d.events("reconcile")) >= scans + 2, 30, "two rescans")
        d.wait_idle(quiet=0.5)
        assert len(d.events("job-start")) == starts
        with open(personas / "ann" / "boom.png", "ab") as f:  # ... only when they change
            f.write(b"changed")
        wait_for(lambda: len(d.events("job-start")) > starts, 10, "a new attempt")
        d.wait_idle(quiet=0.5)
    assert d.summary.failed >= 3


def test_persona_options_change_requeues_its_sources(personas, cache, joblog):
    write_bytes(personas / "ann" / "red.png", blob(1))
    write_bytes(personas / "bob" / "red.png", blob(2))
    with daemon(personas, cache) as d:
        d.wait_idle()
        (personas / "ann" / "persona.toml").write_text("bbox_shift = 6\n")
        d.wait_idle()
    jobs = done_jobs(joblog)
    assert len(jobs) == 3 and jobs[-1]["path"].endswith("ann/red.png")
    rows = source_table(cache, personas)
    assert rows["ann/red.png"]["state"] == HOT


def test_polling_mode(personas, cache, joblog):
    with daemon(personas, cache, polling=True, poll_interval=0.2) as d:
        assert d.daemon.mode == "polling"
        write_bytes(personas / "ann" / "red.png", blob(1))
        d.wait_idle(quiet=1.0)
    assert len(done_jobs(joblog)) == 1


def test_an_overflow_reconciles(personas, cache, joblog):
    with daemon(personas, cache) as d:
        d.daemon.queue.put(Change(OVERFLOW))
        wait_for(lambda: len(d.events("reconcile")) == 2, 10, "a second reconcile")
        assert d.events("warning")


def test_a_file_that_changes_during_its_job_is_settled_again(personas, cache, joblog):
    with daemon(personas, cache) as d:
        target = write_bytes(personas / "ann" / "grow.png", blob(1))
        d.wait_idle()
        assert len(d.events("job-start")) == 2 and len(d.events("job-done")) == 1
        assert not d.events("job-retry") and not d.events("job-failed")
        assert any("queued as a new job" in r["msg"] for r in d.events("settle"))
    first, done = done_jobs(joblog)  # the first one's work was thrown away
    assert done["digest"] == xxhash.xxh3_128_hexdigest(target.read_bytes()) != first["digest"]
    assert source_table(cache, personas)["ann/grow.png"]["digest"] == done["digest"]


def test_a_job_past_its_time_limit_is_killed_and_counted(personas, cache, joblog, monkeypatch):
    monkeypatch.setenv("HOTPLATE_TEST_SLOW", "60")
    with daemon(personas, cache, job_timeout=0.5, retries=1) as d:
        write_bytes(personas / "ann" / "slow.png", blob(1))
        d.wait_idle(quiet=0.5)
        write_bytes(personas / "ann" / "fine.png", blob(2))  # the pool has a fresh worker
        d.wait_idle(quiet=0.5)
    rows = source_table(cache, personas)
    assert rows["ann/slow.png"]["state"] == FAILED
    assert "timed out after 0.5 s" in rows["ann/slow.png"]["error"]
    assert rows["ann/fine.png"]["state"] == HOT


def test_the_folder_itself_vanishing_stops_the_daemon(personas, cache, joblog):
    from watcher.daemon import WatcherError

    d = daemon(personas, cache).start()
    shutil.rmtree(personas)
    wait_for(lambda: not d.thread.is_alive(), 10, "the daemon to stop")
    with pytest.raises(WatcherError, match="was deleted or moved away"):
        d.stop()
