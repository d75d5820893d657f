"""The bounded job queue the render workers serve (records in records.py)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hotplate.serve.metrics import Metrics
from hotplate.serve.problems import Problem
from hotplate.serve.records import CANCELLABLE, Job, JobRecords, Retention, remove, snapshot
from hotplate.serve.workers import RenderWorker


def priority_of(kind: str) -> str:
    """An editor's render, stream or live session goes before a background precompile."""
    return "background" if kind == "precompile" else "editor"


class JobQueue:
    """A bounded queue served by N render workers; every state change is saved and
    wakes whoever waits on it (the one-shot route, the SSE stream)."""

    def __init__(
        self,
        records: JobRecords,
        worker_settings: dict[str, Any],
        workers: int,
        size: int,
        metrics: Metrics,
        retention: Retention,
    ) -> None:
        self.records, self.worker_settings = records, worker_settings
        self.n_workers, self.size = workers, size
        self.live: dict[str, Job] = {}  # queued or running
        self.queue: asyncio.Queue[tuple[Job, dict, Any]] = asyncio.Queue(maxsize=size)
        self.changed = asyncio.Condition()
        self.workers: list[RenderWorker] = []
        self.running: dict[str, RenderWorker] = {}
        self.ready = False
        self.metrics = metrics
        self.recent: deque[float] = deque(maxlen=20)  # service seconds, for Retry-After
        self.retention = retention
        self.threads = ThreadPoolExecutor(max_workers=workers + 1, thread_name_prefix="render")
        self.tasks: list[asyncio.Task] = []

    # -- lifecycle --------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.workers = [RenderWorker(self.worker_settings) for _ in range(self.n_workers)]
        await asyncio.gather(*(loop.run_in_executor(self.threads, w.start) for w in self.workers))
        self.tasks = [asyncio.create_task(self._serve(w)) for w in self.workers]
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        for task in self.tasks:
            task.cancel()
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(None, w.stop) for w in self.workers), return_exceptions=True
        )
        for job in list(self.live.values()):  # a clean stop fails what is left, as a crash would
            job.state, job.status, job.finished = "failed", 503, time.time()
            job.error = "the server stopped before this job finished; submit it again"
            remove(job.audio, job.video)
            self.records.save(job)
        self.threads.shutdown(wait=False, cancel_futures=True)

    # -- submitting and cancelling ----------------------------------------------------

    def submit(self, job: Job, request_fields: dict, recipe: Any) -> Job:
        """Queue the job, or raise Problem 429 with Retry-After when the queue is full."""
        try:
            self.queue.put_nowait((job, request_fields, recipe))
        except asyncio.QueueFull:
            raise Problem(
                429,
                f"the render queue is full ({self.size} jobs waiting); retry later",
                {"Retry-After": str(self.retry_after())},
            ) from None
        self.live[job.id] = job
        self.records.save(job)
        return job

    def retry_after(self) -> int:
        """Seconds until a queue slot is likely free: the recent mean job time per worker."""
        mean = sum(self.recent) / len(self.recent) if self.recent else 5.0
        return max(1, math.ceil(mean * self.queue.qsize() / self.n_workers))

    def depth(self, priority: str | None = None) -> int:
        """Jobs waiting for a worker (of one priority: "editor" or "background")."""
        waiting = [job for job, _, _ in list(self.queue._queue) if job.state == "queued"]
        if priority is None:
            return len(waiting)
        return sum(priority_of(job.kind) == priority for job in waiting)

    def get(self, job_id: str) -> Job | None:
        return self.live.get(job_id) or self.records.get(job_id)

    async def cancel(self, job: Job, reason: str = "cancelled by a DELETE request") -> bool:
        """Cancel a queued or running job: a running one's worker is killed (the pool
        starts another) and its partial output removed. A job that has finished is left
        as it is (a cancel that lands after "done" must not delete the video); returns
        whether it was cancelled."""
        if job.state not in CANCELLABLE:
            return False
        worker = self.running.get(job.id)
        job.state = "cancelled"  # first: the dispatcher then ignores what the worker says
        if worker is not None:  # kill the process running this job, never its replacement
            await asyncio.get_running_loop().run_in_executor(None, worker.kill, worker.process)
        await self._finish(job, "cancelled", error=reason, status=499)
        return True

    async def wait(self, job: Job, seen: tuple, timeout: float) -> None:
        """Return once the job's state or progress differs from `seen`, or after timeout."""
        async with self.changed:
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: snapshot(job) != seen), timeout
                )
            except TimeoutError:
                pass

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # -- serving ------------------------------------------------------------------------

    async def _serve(self, worker: RenderWorker) -> None:
        """Feed jobs to one worker for as long as the server runs; a job's failure, a dead
        worker or a cancel never ends this loop (the worker is replaced instead)."""
        loop = asyncio.get_running_loop()
        while True:
            job, request_fields, recipe = await self.queue.get()
            if job.state != "queued":  # cancelled while it waited
                continue
            job.state, job.started = "running", time.time()
            self.metrics.queue_wait.labels(job.kind).observe(job.started - job.created)
            self.records.save(job)
            await self._notify()
            self.running[job.id] = worker
            process = worker.process
            try:
                await loop.run_in_executor(
                    self.threads, worker.send, (job.id, job.kind, request_fields, recipe)
                )
                await self._follow(job, worker)
            except (OSError, EOFError, ValueError) as exc:  # the pipe broke: the worker died
                if job.state == "running":
                    await self._finish(
                        job, "failed", error=f"the render worker died ({exc})", status=500
                    )
            finally:
                self.running.pop(job.id, None)
            # A cancel kills this job's worker; _follow can return (cancelled) before the
            # kill lands, so make sure of it here, on the process that ran the job.
            if job.state == "cancelled" or not process.is_alive():
                await loop.run_in_executor(self.threads, worker.kill, process)
                await self._restart(worker)

    async def _restart(self, worker: RenderWorker) -> None:
        """Start a fresh worker process, retrying (with a pause) until one comes up."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(self.threads, worker.start)
                return
            except (OSError, RuntimeError) as exc:
                print(f"hotplate serve: render worker failed to start: {exc}", flush=True)
                await asyncio.sleep(1.0)  # not a test wait: back off before the next spawn

    async def _follow(self, job: Job, worker: RenderWorker) -> None:
        loop = asyncio.get_running_loop()
        while True:
            msg = await loop.run_in_executor(self.threads, worker.recv)
            if job.state == "cancelled":
                return
            if msg is None:
                code = await loop.run_in_executor(self.threads, worker.exitcode)
                await self._finish(
                    job, "failed", error=f"the render worker died (exit code {code})", status=500
                )
                return
            if msg[0] == "jit":
                job.jit = True
                await self._notify()
            elif msg[0] == "progress":
                job.step, job.done, job.total = msg[2], msg[3], msg[4]
                if msg[2] == "render" and job.jit is None:  # rendering with no "jit" first
                    job.jit = False
                await self._notify()
            elif msg[0] == "ok":
                await self._finish(job, "done", result=msg[2])
                return
            else:
                await self._finish(job, "failed", error=msg[3], status=msg[2])
                return

    async def _finish(
        self,
        job: Job,
        state: str,
        result: dict | None = None,
        error: str | None = None,
        status: int | None = None,
    ) -> None:
        job.state, job.finished, job.error, job.status = state, time.time(), error, status
        for key, value in (result or {}).items():
            if hasattr(job, key):
                setattr(job, key, value)
        job.total_seconds = job.finished - job.created
        remove(job.audio)
        job.audio = None
        if state != "done":
            remove(job.video)
            job.video = None
        else:
            self._measure(job)
        self.metrics.renders.labels(state).inc()
        self.live.pop(job.id, None)
        self.records.save(job)
        if state == "done" and self.retention.max_bytes is not None:
            await asyncio.to_thread(self._retain, None)
        await self._notify()

    def _measure(self, job: Job) -> None:
        """A finished job's figures: service time (for Retry-After) and the histograms."""
        m = self.metrics
        service = job.finished - (job.started or job.created)
        self.recent.append(service)
        m.render_seconds.observe(job.total_seconds)
        jit = job.jit_seconds if job.jit and job.jit_seconds else 0.0
        if job.jit:
            m.jit.inc()
            m.jit_seconds.observe(jit)
        rendering = service - jit
        if job.kind != "precompile" and job.audio_seconds and rendering > 0:
            m.realtime_factor.labels(job.kind, job.backend).observe(job.audio_seconds / rendering)

    async def sweep(self, now: Callable[[], float] = time.time) -> None:
        """Apply the retention rules now and then (a tenth of --keep-videos, at least
        every minute; the size cap is also checked as each video is finished), for as
        long as the server runs."""
        keep = self.retention
        while True:
            await asyncio.to_thread(self._retain, now())
            await asyncio.sleep(min(60.0, max(keep.keep_s / 10, 0.2)))

    def _retain(self, now: float | None) -> None:
        """Apply the retention rules (by age unless `now` is None) and count what went."""
        keep, m = self.retention, self.metrics
        if now is not None:
            m.expired.labels("age").inc(self.records.expire(now, keep.keep_s)[0])
        if keep.max_bytes is not None:
            m.expired.labels("size").inc(self.records.trim(keep.data, keep.max_bytes))
