"""The daemon's outcomes: jobs to idle workers, what they report into the `source` rows."""

from __future__ import annotations

import time
from typing import Any

from pipeline.catalog import Source
from watcher.jobs import Job, Outcome, backoff_delay
from watcher.sources import FAILED, HOT, RETRY, RUNNING, load_rows, put_rows


class Outcomes:
    def _touch(self, rels: list[str]) -> None:
        if not rels:
            return
        rows = load_rows(self.store, self.root)
        now = time.time()
        put_rows(self.store, {r: {**rows[r], "last_seen": now} for r in rels if r in rows})

    # -- jobs -----------------------------------------------------------------------------

    def _dispatch(self) -> None:
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
            self._set_rows(job, state=RUNNING)
            self.pool.submit(worker, job, self.root / rel, stat)
            others = f", with {len(job.paths) - 1} same-content files" if len(job.paths) > 1 else ""
            self.log(
                "job-start",
                rel,
                f"job {job.id}, attempt {job.attempts + 1}/{self.c.retries}, worker pid "
                f"{worker.pid}{others}",
                job=job.id,
                attempt=job.attempts + 1,
                worker=worker.pid,
            )

    def _on_outcome(self, o: Outcome) -> None:
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
            self._set_rows(job, state=HOT, error="", attempts=0, seconds=round(seconds, 3))
            for rel in job.paths:
                self._result_of(rel, HOT, seconds, "")
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
        else:
            job.attempts += 1
            error = str(o.detail)
            final = job.attempts >= self.c.retries
            self._error(job.path, error, job.attempts, final)
            if not final:
                delay = backoff_delay(job.attempts, self.c.backoff)
                self.jobs.defer(job, now + delay, error)
                self.retried += 1
                self._set_rows(job, state=RETRY, error=error, attempts=job.attempts)
                self.log(
                    "job-retry",
                    job.path,
                    f"job {job.id} failed (attempt {job.attempts}/{self.c.retries}): {error}; "
                    f"retrying in {delay:.1f} s",
                    job=job.id,
                    error=error,
                )
            else:
                self.jobs.finish(job)
                self.summary.failed += 1
                self._set_rows(job, state=FAILED, error=error, attempts=job.attempts)
                for rel in job.paths:
                    self._result_of(rel, FAILED, None, error)
                self.log(
                    "job-failed",
                    job.path,
                    f"job {job.id} gave up after {job.attempts} attempts: {error} "
                    f"(it is tried again when the file changes)",
                    job=job.id,
                    error=error,
                )

    def _set_rows(self, job: Job, **changes: Any) -> None:
        rows = {}
        now = time.time()
        for rel in job.paths:
            row = self.store.read_value("source", rel)
            if isinstance(row, dict) and row.get("avatar") == job.avatar:
                rows[rel] = {**row, **changes, "updated": now, "last_seen": now}
        put_rows(self.store, rows)

    def _error(self, rel: str, error: str, attempts: int, final: bool) -> None:
        self.errors.append(
            {"path": rel, "error": error, "time": time.time(), "attempts": attempts, "final": final}
        )

    def _result(self, rel: str, src: Source, state: str, seconds: float | None, error: str) -> None:
        self.summary.results[rel] = {
            "persona": src.persona,
            "attire": src.attire,
            "motion": src.motion,
            "state": state,
            "seconds": seconds,
            "error": error,
        }

    def _result_of(self, rel: str, state: str, seconds: float | None, error: str) -> None:
        row = self.store.read_value("source", rel) or {}
        src = Source(
            row.get("persona", "?"),
            row.get("attire", "?"),
            row.get("motion", "?"),
            self.root / rel,
            row.get("kind", "?"),
        )
        self._result(rel, src, state, seconds, error)
