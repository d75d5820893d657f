"""The intake on its own: a change it cannot act on alone comes back as a Verdict for the
loop (rescan, stop); a settled file becomes a row and a job, or a hot row."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachestore.store import open_store
from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe
from tests.watcher.helpers import write_still
from watcher.events import CREATED, DIR_DELETED, OVERFLOW, Change
from watcher.intake import RESCAN, STOP, Intake, Verdict
from watcher.jobs import JobQueue, WorkerPool
from watcher.keys import Keys
from watcher.outcomes import Outcomes, Summary
from watcher.settle import Settler
from watcher.sources import HOT, QUEUED, load_rows

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def intake_of(root: Path, cache: Path) -> tuple[Intake, JobQueue, Settler]:
    store = open_store(cache)
    settler = Settler(root, 0.0, need_close=False)
    jobs = JobQueue()
    pool = WorkerPool(1, cache)  # never started: nothing here dispatches
    outcomes = Outcomes(root, store, jobs, pool, settler, 3, 0.1, Summary(), lambda *a, **k: None)
    keys = Keys(root, Recipe(max_frames=8))
    return Intake(root, store, settler, jobs, keys, outcomes, lambda *a, **k: None), jobs, settler


def test_what_only_the_loop_may_do_comes_back_as_a_verdict(tmp_path):
    root = tmp_path / "personas"
    root.mkdir()
    intake, _, _ = intake_of(root.resolve(), tmp_path / "cache")
    rescan = intake.on_change(Change(OVERFLOW))
    assert isinstance(rescan, Verdict) and rescan.action == RESCAN
    stop = intake.on_change(Change(DIR_DELETED))  # the personas folder itself
    assert stop.action == STOP and str(root.resolve()) in stop.reason
    assert intake.on_change(Change(DIR_DELETED, "ruby")) is None  # a persona: handled here


def test_a_settled_file_becomes_a_job_then_a_hot_row_once_its_avatar_exists(tmp_path):
    root = (tmp_path / "personas").resolve()
    write_still(root / "ruby" / "portrait.png")
    intake, jobs, settler = intake_of(root, tmp_path / "cache")
    assert intake.on_change(Change(CREATED, "ruby/portrait.png")) is None
    assert "ruby/portrait.png" in settler
    intake.ready("ruby/portrait.png")
    job = jobs.job_of("ruby/portrait.png")
    assert job is not None and load_rows(intake.store, root)["ruby/portrait.png"]["state"] == QUEUED
    assert job.avatar == plan(job.digest, Recipe(max_frames=8)).avatar

    intake.store.put_avatar(job.avatar, {"stages": {}})  # as if a worker had made it hot
    jobs.remove_path("ruby/portrait.png")
    intake.ready("ruby/portrait.png")
    assert jobs.job_of("ruby/portrait.png") is None
    assert load_rows(intake.store, root)["ruby/portrait.png"]["state"] == HOT
