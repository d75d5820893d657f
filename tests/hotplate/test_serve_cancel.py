"""The server's job queue with a real render worker process: a cancel that lands after a
job finished (the stream route's deferred cancel when its client goes away as the render
ends) leaves the job done and its video kept."""

import asyncio
import time
from pathlib import Path

import pytest

from hotplate.serve.queue import JobQueue
from hotplate.serve.records import FINISHED, Job, JobRecords, new_id, snapshot
from pipeline.precompile.recipe import Recipe
from testkit.serve_helpers import make_world, speech

pytestmark = pytest.mark.slow


def test_a_cancel_after_done_keeps_the_job_and_its_video(tmp_path):
    root = make_world(tmp_path)
    wav = speech(tmp_path / "one.wav", 1.0)
    data = tmp_path / "data"
    (data / "videos").mkdir(parents=True)
    settings = {
        "personas": str(root / "personas"),
        "cache": str(tmp_path / "cache"),
        "map_size": 64 << 20,
        "models": str(tmp_path / "models"),
        "loop": "pingpong",
        "flight_wait": 900.0,
    }

    async def scenario() -> tuple[Job, bool, Job | None]:
        records = JobRecords(data / "jobs.sqlite")
        queue = JobQueue(records, settings, workers=1, size=4)
        await queue.start()
        try:
            job = Job(new_id(), "render", "astro", "studio", None, "warp", time.time())
            job.video = str(data / "videos" / f"{job.id}.mp4")
            fields = {
                "persona": "astro",
                "attire": "studio",
                "motion": None,
                "audio": wav,
                "output": Path(job.video),
                "backend": "warp",
            }
            queue.submit(job, fields, Recipe())
            deadline = time.monotonic() + 300
            while job.state not in FINISHED and time.monotonic() < deadline:
                await queue.wait(job, snapshot(job), 5.0)
            assert job.state == "done", job.error
            cancelled = await queue.cancel(job)  # what a late cancel does
            return job, cancelled, records.get(job.id)
        finally:
            await queue.stop()

    job, cancelled, record = asyncio.run(scenario())
    assert not cancelled
    assert job.state == "done" and record is not None and record.state == "done"
    assert job.video and Path(job.video).stat().st_size > 0
