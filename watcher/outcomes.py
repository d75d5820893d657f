"""The daemon's outcomes: jobs to idle workers, and what they and the intake report into
the `source` rows, the heartbeat's last errors and the run's summary."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachestore.keys import FileStat
from cachestore.store import Store
from pipeline.catalog import Source
from watcher.jobs import Job, JobQueue, Outcome, WorkerPool, backoff_delay
from watcher.settle import Settler
from watcher.sources import FAILED, HOT, RETRY, RUNNING, load_rows, new_row, put_rows, stat_of

MAX_ERRORS = 10  # last errors kept for the heartbeat


@dataclass
class Summary:
    done: int = 0  # jobs that made an avatar hot
    failed: int = 0  # jobs given up
    unchanged: int = 0  # sources hot already at the last reconcile
    failed_before: dict[str, str] = field(default_factory=dict)  # rel -> error, left alone
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # rel -> final state


class Outcomes:
    """Hands waiting jobs to idle workers and records what becomes of each source."""

    def __init__(
        self,
        root: Path,
        store: Store,
        jobs: JobQueue,
        pool: WorkerPool,
        settler: Settler,
        retries: int,
        backoff: float,
        summary: Summary,
        log: Any,
    ) -> None:
        self.root, self.store, self.jobs, self.pool, self.settler = root, store, jobs, pool, settler
        self.retries, self.backoff = retries, backoff
        self.summary = summary
        self.log = log
        self.retried = 0
        self.errors: deque[dict[str, Any]] = deque(maxlen=MAX_ERRORS)

    def touch(self, rels: list[str]) -> None:
        if not rels:
            return
        rows = load_rows(self.store, self.root)
        now = time.time()
        put_rows(self.store, {r: {**rows[r], "last_seen": now} for r in rels if r in rows})

    def dispatch(self) -> None:
        now = time.monotonic()
        if not self.pool.workers and self.jobs.next_ready(now) is not None:
            self.pool.start()
        while True:
            worker = self.pool.idle()
            job = self.jobs.next_ready(now) if worker else None
            if worker is None or job is None:
                return
            rel, stat = next(iter(job.paths.items()))
            self.jobs.start(job, rel, now)
            self.set_rows(job, state=RUNNING)
            self.pool.submit(worker, job, self.root / rel, stat)
            others = f", with {len(job.paths) - 1} same-content files" if len(job.paths) > 1 else ""
            self.log(
                "job-start",
                rel,
                f"job {job.id}, attempt {job.attempts + 1}/{self.retries}, worker pid "
                f"{worker.pid}{others}",
                job=job.id,
                attempt=job.attempts + 1,
                worker=worker.pid,
            )

    def on_outcome(self, o: Outcome) -> None:
        job, now = o.job, time.monotonic()
        if o.status == "ok" and o.detail.get("digest", job.digest) != job.digest:
            # precompile read a snapshot of the new bytes and filed them under their own
            # digest (never the queued one); the file is hashed again once it is still
            # and its current content becomes a job of its own (or a hit)
            made = str(o.detail.get("digest"))[:12]
            o = Outcome(job, "changed", f"{job.path} changed; content {made} was made hot")
        if o.status == "ok":
            self.jobs.finish(job)
            self.summary.done += 1
            seconds = float(o.detail.get("seconds", now - job.started))
            self.set_rows(job, state=HOT, error="", attempts=0, seconds=round(seconds, 3))
            for rel in job.paths:
                self.result_of(rel, HOT, seconds, "")
            cached = " (every stage was a cache hit)" if o.detail.get("hit") else ""
            self.log(
                "job-done",
                job.path,
                f"job {job.id} hot in {seconds:.2f} s{cached}; {len(job.paths)} source(s)",
                job=job.id,
                seconds=round(seconds, 3),
            )
        elif o.status == "changed":
            self.jobs.finish(job)
            for rel in job.paths:
                self.settler.note(rel, closed=rel != job.path, quiet_since=None)
            self.log(
                "settle",
                job.path,
                f"job {job.id} stopped: {o.detail}; its new content is queued as a new job "
                f"once the file is still",
            )
        elif o.status == "cancelled":
            # a cancel, a refusal or a drain says nothing about the file: it runs again
            # after the first backoff, its attempts as they were, so no number of them
            # makes it failed (issue 64)
            delay = backoff_delay(1, self.backoff)
            self.jobs.defer(job, now + delay, str(o.detail))
            self.retried += 1
            self.set_rows(job, state=RETRY, error=str(o.detail), attempts=job.attempts)
            self.log(
                "job-retry",
                job.path,
                f"job {job.id} did not run to its end: {o.detail}; not a failed attempt, "
                f"running again in {delay:.1f} s",
                job=job.id,
                error=str(o.detail),
            )
        else:
            job.attempts += 1
            error = str(o.detail)
            final = job.attempts >= self.retries
            self.error(job.path, error, job.attempts, final)
            if not final:
                delay = backoff_delay(job.attempts, self.backoff)
                self.jobs.defer(job, now + delay, error)
                self.retried += 1
                self.set_rows(job, state=RETRY, error=error, attempts=job.attempts)
                self.log(
                    "job-retry",
                    job.path,
                    f"job {job.id} failed (attempt {job.attempts}/{self.retries}): {error}; "
                    f"retrying in {delay:.1f} s",
                    job=job.id,
                    error=error,
                )
            else:
                self.jobs.finish(job)
                self.summary.failed += 1
                self.set_rows(job, state=FAILED, error=error, attempts=job.attempts)
                for rel in job.paths:
                    self.result_of(rel, FAILED, None, error)
                self.log(
                    "job-failed",
                    job.path,
                    f"job {job.id} gave up after {job.attempts} attempts: {error} "
                    f"(it is tried again when the file changes)",
                    job=job.id,
                    error=error,
                )

    def set_rows(self, job: Job, **changes: Any) -> None:
        rows = {}
        now = time.time()
        for rel in job.paths:
            row = self.store.read_value("source", rel)
            if isinstance(row, dict) and row.get("avatar") == job.avatar:
                rows[rel] = {**row, **changes, "updated": now, "last_seen": now}
        put_rows(self.store, rows)

    def error(self, rel: str, error: str, attempts: int, final: bool) -> None:
        self.errors.append(
            {"path": rel, "error": error, "time": time.time(), "attempts": attempts, "final": final}
        )

    def result(self, rel: str, src: Source, state: str, seconds: float | None, error: str) -> None:
        self.summary.results[rel] = {
            "persona": src.persona,
            "attire": src.attire,
            "motion": src.motion,
            "state": state,
            "seconds": seconds,
            "error": error,
        }

    def result_of(self, rel: str, state: str, seconds: float | None, error: str) -> None:
        row = self.store.read_value("source", rel) or {}
        src = Source(
            row.get("persona", "?"),
            row.get("attire", "?"),
            row.get("motion", "?"),
            self.root / rel,
            row.get("kind", "?"),
        )
        self.result(rel, src, state, seconds, error)

    def fail(
        self, rel: str, src: Source, error: str, stat: FileStat | None = None, digest: str = ""
    ) -> None:
        """A source that cannot become a job (unreadable, bad persona.toml): a failed row."""
        try:
            stat = stat or stat_of(self.root / rel)
        except OSError:
            return
        row = new_row(self.root, src, stat, digest, "", FAILED)
        row["error"] = error
        put_rows(self.store, {rel: row})
        self.error(rel, error, 1, final=True)
        self.result(rel, src, FAILED, None, error)
        self.summary.failed += 1
        self.log("job-failed", rel, error)
