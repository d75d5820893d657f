"""Jobs: their records in SQLite beside the store, and the bounded queue the workers serve.

A job is queued, running, then done, failed or cancelled. Its record survives restarts:
at start, jobs a dead server left queued or running are marked failed with the reason.
Outputs older than the retention period are deleted (the record stays, state expired).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import math
import os
import secrets
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cachestore.atomic import temps_of
from cachestore.flight import Holder
from hotplate.serve.problems import Problem
from hotplate.serve.workers import RenderWorker

FINISHED = ("done", "failed", "cancelled", "expired")


@dataclass
class Job:
    id: str
    kind: str  # render or precompile
    persona: str
    attire: str
    motion: str | None
    backend: str
    created: float
    state: str = "queued"
    started: float | None = None
    finished: float | None = None
    step: str = ""
    done: int = 0
    total: int = 0
    jit: bool | None = None
    jit_seconds: float | None = None
    first_frame_seconds: float | None = None
    total_seconds: float | None = None
    audio_seconds: float | None = None
    avatar: str | None = None
    error: str | None = None
    status: int | None = None  # the HTTP status of a failure
    audio: str | None = None  # the uploaded file (deleted when the job ends)
    video: str | None = None  # the output (kept for the retention period)
    owner: str | None = None  # the client that created it (guard.client_id); may cancel it

    def __post_init__(self) -> None:
        if self.jit is not None:  # SQLite gives 0/1 back
            self.jit = bool(self.jit)

    def public(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("audio", "video")}
        out["progress"] = round(self.fraction(), 4)
        out["status_url"] = f"/v1/renders/{self.id}"
        if self.kind == "render" and self.state == "done":
            out["video_url"] = f"/v1/renders/{self.id}/video"
        return out

    def fraction(self) -> float:
        """Overall progress: a JIT precompile is the first half, the render the rest."""
        if self.state == "done":
            return 1.0
        part = self.done / self.total if self.total else 0.0
        if self.kind == "precompile":
            return part
        if self.step == "render":
            return 0.5 + 0.5 * part if self.jit else part
        return 0.5 * part if self.step else 0.0


COLUMNS = [f.name for f in fields(Job)]


class JobRecords:
    """The jobs table, one SQLite file; safe to call from any thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.lock = threading.Lock()
        cols = ", ".join(f"{c} {'TEXT PRIMARY KEY' if c == 'id' else ''}" for c in COLUMNS)
        with self.lock:
            self.db.execute(f"CREATE TABLE IF NOT EXISTS jobs ({cols})")
            have = {row[1] for row in self.db.execute("PRAGMA table_info(jobs)")}
            for missing in (c for c in COLUMNS if c not in have):  # records of older servers
                self.db.execute(f"ALTER TABLE jobs ADD COLUMN {missing}")

    def save(self, job: Job) -> None:
        row = asdict(job)
        marks = ", ".join("?" for _ in COLUMNS)
        with self.lock:
            self.db.execute(
                f"INSERT OR REPLACE INTO jobs ({', '.join(COLUMNS)}) VALUES ({marks})",
                [row[c] for c in COLUMNS],
            )

    def get(self, job_id: str) -> Job | None:
        rows = self._select("WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def recent(self, limit: int = 50) -> list[Job]:
        return self._select("ORDER BY created DESC LIMIT ?", (limit,))

    def delete(self, job_id: str) -> None:
        with self.lock:
            self.db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def _select(self, where: str, args: tuple) -> list[Job]:
        with self.lock:
            rows = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs {where}", args)
            return [Job(**dict(zip(COLUMNS, row, strict=True))) for row in rows.fetchall()]

    def fail_interrupted(self) -> list[Job]:
        """Mark what a dead server left queued or running as failed; returns those jobs."""
        left = self._select("WHERE state IN ('queued', 'running')", ())
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        for job in left:
            job.error = (
                f"the server stopped while this job was {job.state} (restarted {when}); "
                "submit it again"
            )
            job.state, job.status, job.finished = "failed", 503, time.time()
            remove(job.audio, job.video)
            job.audio = job.video = None
            self.save(job)
        return left

    def expire(self, older_than: float) -> int:
        """Delete the outputs of jobs finished before `older_than`; returns how many."""
        old = self._select(
            "WHERE finished IS NOT NULL AND finished < ? AND video IS NOT NULL", (older_than,)
        )
        for job in old:
            remove(job.video)
            job.video, job.state = None, "expired" if job.state == "done" else job.state
            self.save(job)
        return len(old)


def remove(*paths: str | None) -> None:
    """Delete these files and any partial copy of them a killed writer left beside them."""
    for p in paths:
        if p:
            for path in (Path(p), *temps_of(p)):
                path.unlink(missing_ok=True)


LOCK_NAME = "serve.lock"
_CLAIMED: dict[str, int] = {}  # data dir -> the fd holding its lock, for this process's life


class DataDirBusyError(RuntimeError):
    """Another `hotplate serve` uses this data directory."""


def claim_data_dir(data: Path) -> None:
    """Make this process the one server of `data` (job records, uploads, videos) for as
    long as it lives: two servers would fail each other's live jobs and delete their
    files. The kernel drops the lock when the process dies, kill -9 included. Then
    removes what a dead server left there: uploads and partial videos. Raises
    DataDirBusyError naming the other server's pid; calling it again is a no-op."""
    data.mkdir(parents=True, exist_ok=True)
    real = os.path.realpath(data)
    if real in _CLAIMED:
        return
    fd = os.open(data / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = Holder.read(fd)
        os.close(fd)
        raise DataDirBusyError(
            f"another hotplate serve ({holder or 'a process starting'}) uses {data}; "
            f"stop it, or give this server its own --data directory"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(Holder.me().record()).encode(), 0)
    _CLAIMED[real] = fd
    _sweep_orphans(data)


def _sweep_orphans(data: Path) -> None:
    """Files no live job owns: at start every upload is a dead server's, and so is every
    partial video (`.<id>.mp4.tmp-*`)."""
    for path in (data / "uploads").glob("*"):
        if path.is_file():
            path.unlink(missing_ok=True)
    for path in (data / "videos").glob(".*.tmp-*"):
        path.unlink(missing_ok=True)


@dataclass
class Stats:
    """What /metrics reports about jobs since the server started."""

    finished: dict[str, int] = field(default_factory=dict)  # state -> count
    render_seconds: list[float] = field(default_factory=list)
    jit_seconds: list[float] = field(default_factory=list)
    recent: deque = field(default_factory=lambda: deque(maxlen=20))  # for Retry-After


class JobQueue:
    """A bounded queue served by N render workers; every state change is saved and
    wakes whoever waits on it (the one-shot route, the SSE stream)."""

    def __init__(
        self, records: JobRecords, worker_settings: dict[str, Any], workers: int, size: int
    ) -> None:
        self.records, self.worker_settings = records, worker_settings
        self.n_workers, self.size = workers, size
        self.live: dict[str, Job] = {}  # queued or running
        self.queue: asyncio.Queue[tuple[Job, dict, Any]] = asyncio.Queue(maxsize=size)
        self.changed = asyncio.Condition()
        self.workers: list[RenderWorker] = []
        self.running: dict[str, RenderWorker] = {}
        self.ready = False
        self.stats = Stats()
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
        mean = sum(self.stats.recent) / len(self.stats.recent) if self.stats.recent else 5.0
        return max(1, math.ceil(mean * self.queue.qsize() / self.n_workers))

    def get(self, job_id: str) -> Job | None:
        return self.live.get(job_id) or self.records.get(job_id)

    async def cancel(self, job: Job) -> None:
        """Cancel a queued or running job: a running one's worker is killed (the pool
        starts another) and its partial output removed."""
        worker = self.running.get(job.id)
        job.state = "cancelled"  # first: the dispatcher then ignores what the worker says
        if worker is not None:  # kill the process running this job, never its replacement
            await asyncio.get_running_loop().run_in_executor(None, worker.kill, worker.process)
        await self._finish(job, "cancelled", error="cancelled by a DELETE request", status=499)

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
            if msg[0] == "progress":
                job.step, job.done, job.total = msg[2], msg[3], msg[4]
                if msg[2] == "render" and job.jit is None:
                    job.jit = False
                elif msg[2].startswith("jit"):
                    job.jit = True
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
            self.stats.render_seconds.append(job.total_seconds)
            self.stats.recent.append(job.finished - (job.started or job.created))
            if job.jit and job.jit_seconds:
                self.stats.jit_seconds.append(job.jit_seconds)
        self.stats.finished[state] = self.stats.finished.get(state, 0) + 1
        self.live.pop(job.id, None)
        self.records.save(job)
        await self._notify()

    async def sweep(self, retention_s: float, every_s: float, now: Callable[[], float]) -> None:
        """Delete expired outputs every `every_s` seconds, for as long as the server runs."""
        while True:
            self.records.expire(now() - retention_s)
            await asyncio.sleep(every_s)


def snapshot(job: Job) -> tuple:
    return (job.state, job.step, job.done, job.total)


def new_id() -> str:
    return secrets.token_hex(8)
