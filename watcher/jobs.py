"""The job queue (one job per avatar: identical files share it) and the worker pool.

`JobQueue` is plain bookkeeping and is tested without processes. `WorkerPool` keeps N
spawned worker processes (watcher/worker.py) alive across jobs, sends each one job at
a time, and turns what comes back -- a result, or a process that died -- into an
`Outcome`. A worker that dies is replaced; the daemon never goes down with it.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from cachestore.flight import DEFAULT_WAIT
from cachestore.keys import FileStat
from watcher.process import spawn
from watcher.worker import DEFAULT_JOB, worker_main


class WorkerFatalError(RuntimeError):
    """Workers cannot run jobs at all (the job function does not load, or they crash at start)."""


@dataclass
class Job:
    """One precompile: an avatar key and every source path waiting for it."""

    id: int
    avatar: str
    digest: str
    recipe: Any
    paths: dict[str, FileStat]  # personas-relative path -> stat when it was hashed
    attempts: int = 0  # failed attempts so far
    ready_at: float = 0.0  # monotonic time it may (re)start
    running: bool = False
    path: str = ""  # the path being processed while running
    started: float = 0.0
    error: str = ""


class JobQueue:
    """Jobs keyed by avatar, so the same content (under the same recipe) runs once."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}  # avatar -> job, in arrival order
        self._next_id = 1

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def running(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.running]

    @property
    def waiting(self) -> list[Job]:
        return [j for j in self.jobs.values() if not j.running]

    def add(
        self, avatar: str, digest: str, recipe: Any, rel: str, stat: FileStat
    ) -> tuple[Job, bool]:
        """Queue rel for avatar; returns (job, created). A second path joins the job."""
        self.remove_path(rel, keep=avatar)
        job = self.jobs.get(avatar)
        if job is not None:
            job.paths[rel] = stat
            return job, False
        job = Job(self._next_id, avatar, digest, recipe, {rel: stat})
        self._next_id += 1
        self.jobs[avatar] = job
        return job, True

    def job_of(self, rel: str) -> Job | None:
        return next((j for j in self.jobs.values() if rel in j.paths), None)

    def remove_path(self, rel: str, keep: str = "") -> Job | None:
        """Take rel out of its job (other than avatar `keep`); a waiting job left with no
        path is dropped. Returns the job rel was in, if any."""
        for job in list(self.jobs.values()):
            if job.avatar != keep and rel in job.paths:
                del job.paths[rel]
                if not job.paths and not job.running:
                    del self.jobs[job.avatar]
                return job
        return None

    def next_ready(self, now: float) -> Job | None:
        return next(
            (j for j in self.jobs.values() if not j.running and j.ready_at <= now and j.paths), None
        )

    def next_ready_at(self) -> float | None:
        times = [j.ready_at for j in self.jobs.values() if not j.running and j.paths]
        return min(times) if times else None

    def start(self, job: Job, rel: str, now: float) -> None:
        job.running, job.path, job.started = True, rel, now

    def finish(self, job: Job) -> None:
        self.jobs.pop(job.avatar, None)

    def defer(self, job: Job, until: float, error: str) -> None:
        job.running, job.ready_at, job.error = False, until, error
        if not job.paths:
            self.jobs.pop(job.avatar, None)


def backoff_delay(attempts: int, base: float) -> float:
    """Seconds before attempt attempts+1: base, 2 base, 4 base, ..."""
    return base * 2 ** max(attempts - 1, 0)


@dataclass
class Outcome:
    job: Job
    status: str  # ok, changed, error, died; or cancelled: not the file's doing (a cancel,
    # a refusal, a drain: `hotplate serve --watch`), run again and not counted as an attempt
    detail: Any = None  # the result dict (ok) or one line (otherwise)


@dataclass
class Worker:
    process: Any
    conn: Connection
    job: Job | None = None
    pid: int = 0
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    killed_because: str = ""  # set when the pool kills it (a job past its time limit)


def exit_reason(code: int | None) -> str:
    if code is None:
        return "is gone"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class WorkerPool:
    """N spawned workers; each runs one job at a time and lives across jobs."""

    MAX_EARLY_DEATHS = 5  # consecutive deaths before ready: the workers cannot start

    def __init__(
        self,
        size: int,
        cache: Path,
        job: str = DEFAULT_JOB,
        map_size: int | None = None,
        flight_wait: float = DEFAULT_WAIT,
    ) -> None:
        if size < 1:
            raise ValueError(f"workers={size} must be >= 1")
        self.size, self.cache, self.job_spec = size, Path(cache), job
        self.map_size, self.flight_wait = map_size, flight_wait
        self.workers: list[Worker] = []
        self.early_deaths = 0
        self.started = 0

    def start(self) -> None:
        while len(self.workers) < self.size:
            self._spawn()

    def _spawn(self) -> Worker:
        process, parent = spawn(
            worker_main,
            (str(self.cache), self.job_spec, self.map_size, self.flight_wait),
            f"hotplate-worker-{self.started + 1}",
        )
        self.started += 1
        worker = Worker(process, parent, pid=process.pid or 0)
        self.workers.append(worker)
        return worker

    def idle(self) -> Worker | None:
        return next((w for w in self.workers if w.job is None and w.process.is_alive()), None)

    def submit(self, worker: Worker, job: Job, path: Path, stat: FileStat) -> None:
        worker.job = job
        worker.conn.send((job.id, str(path), job.recipe, dict(stat.__dict__)))

    def waitables(self) -> list[Any]:
        return [w.conn for w in self.workers] + [w.process.sentinel for w in self.workers]

    def poll(self) -> list[Outcome]:
        """Every result that has arrived and every worker that died (replaced here)."""
        outcomes: list[Outcome] = []
        for worker in list(self.workers):
            outcomes.extend(self._read(worker))
            if not worker.process.is_alive() or worker.conn.closed:
                outcomes.extend(self._bury(worker))
        return outcomes

    def _read(self, worker: Worker) -> list[Outcome]:
        out: list[Outcome] = []
        try:
            while not worker.conn.closed and worker.conn.poll():
                msg = worker.conn.recv()
                if msg[0] == "ready":
                    worker.ready, self.early_deaths = True, 0
                elif msg[0] == "fatal":
                    raise WorkerFatalError(f"workers cannot run jobs: {msg[2]}")
                elif worker.job is not None and msg[1] == worker.job.id:
                    out.append(Outcome(worker.job, msg[0], msg[2]))
                    worker.job = None
        except (EOFError, OSError):
            worker.conn.close()
        return out

    def _bury(self, worker: Worker) -> list[Outcome]:
        worker.process.join(timeout=1)
        if worker.process.is_alive():  # its pipe broke but it lingers: do not leak it
            worker.process.kill()
            worker.process.join(timeout=1)
        self.workers.remove(worker)
        if not worker.conn.closed:
            worker.conn.close()
        out = []
        if worker.job is not None:
            why = worker.killed_because or (
                f"worker pid {worker.pid} {exit_reason(worker.process.exitcode)} during the job"
            )
            out.append(Outcome(worker.job, "died", why))
        elif not worker.ready:
            self.early_deaths += 1
            if self.early_deaths >= self.MAX_EARLY_DEATHS:
                raise WorkerFatalError(
                    f"workers die as they start (last: pid {worker.pid} "
                    f"{exit_reason(worker.process.exitcode)}); run `hotplate doctor`"
                )
        self._spawn()
        return out

    def kill_overdue(self, limit: float, now: float) -> list[Job]:
        """Kill workers whose job has run longer than limit seconds (0 = no limit); the
        next poll() reports each as died, with the reason."""
        overdue = []
        for w in self.workers:
            if limit > 0 and w.job is not None and now - w.job.started > limit:
                w.killed_because = f"timed out after {limit:g} s (worker pid {w.pid} killed)"
                w.process.kill()
                overdue.append(w.job)
        return overdue

    def stop(self, grace: float) -> list[Outcome]:
        """Let running jobs finish for up to grace seconds, then terminate the rest.

        Returns the outcomes that arrived meanwhile; jobs still running are abandoned
        (their workers are killed; the store's per-stage transactions leave no
        partial manifest).
        """
        from multiprocessing.connection import wait

        outcomes: list[Outcome] = []
        deadline = time.monotonic() + grace
        for w in self.workers:
            if w.job is None:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
        while any(w.job is not None and w.process.is_alive() for w in self.workers):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            wait([w.conn for w in self.workers if not w.conn.closed], timeout=min(left, 0.2))
            for w in self.workers:
                outcomes.extend(self._read(w))
                if w.job is None and not w.conn.closed:
                    try:
                        w.conn.send(None)
                    except OSError:
                        pass
        for w in self.workers:
            w.process.join(timeout=0.5 if w.job is None else 0)
            if w.process.is_alive():
                w.process.terminate()
        for w in self.workers:
            w.process.join(timeout=2)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=2)
            if not w.conn.closed:
                w.conn.close()
        self.workers.clear()
        return outcomes
