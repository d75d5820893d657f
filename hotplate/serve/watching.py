"""`hotplate serve --watch`: the server keeps its personas folder hot through its own queue.

The watcher daemon (watcher/daemon.py) runs on a thread of the server and does what
`hotplate watch` does (notice, settle, hash, deduplicate by avatar, retry, record each
file's state for `hotplate status`), but its pool is `QueuePool`: each job becomes a
background precompile in the server's JobQueue instead of going to worker processes of
its own. So there is one queue for the API's precompiles and the watcher's, with one
bound (--max-queued-precompiles), one order (a render always first), one listing
(GET /v1/precompile, owner "watcher") and the server's workers, which run on the file
what the watcher's worker would (workers.precompile_file). The pool offers the daemon a
place while the background queue has room: files past the bound wait in the watcher, in
arrival order, and go in as places free.

The daemon calls the pool from its thread; whatever touches the queue runs on the
server's event loop (`_on_loop`), and the queue tells the pool of each job's end
(`JobQueue.on_end`), which wakes the daemon through a pipe it waits on.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Pipe
from pathlib import Path
from typing import Any

from hotplate.serve.problems import Problem
from hotplate.serve.records import Job, new_id
from watcher.health import SERVER_WATCH
from watcher.jobs import Job as FileJob
from watcher.jobs import Outcome

OWNER = "watcher"  # the client the watcher's precompiles are queued for
ON_LOOP_TIMEOUT = 60.0  # s: the loop answers within a turn; a stuck one is a bug to see


@dataclass(eq=False)
class Slot:
    """What the daemon calls a worker: one of its jobs, queued in the server."""

    pid: int  # the daemon's log names a worker's pid: here the server's
    job: FileJob | None = None
    queued: Job | None = None  # the server's job for it
    killed_because: str = ""  # set when the pool cancels it (past --job-timeout)
    abandoned: bool = False  # the watcher stopped: its end is nobody's outcome


class QueuePool:
    """The daemon's pool (watcher.jobs.WorkerPool's methods) on the server's queue."""

    def __init__(self, service: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.service, self.queue, self.loop = service, service.queue, loop
        self.root = Path(service.config.settings.personas).resolve()
        self.workers: list[Slot] = []  # the jobs handed to the queue, not yet ended
        self._lock = threading.Lock()
        self._arrived: list[Outcome] = []
        self._reader, self._writer = Pipe(duplex=False)

    def _on_loop(self, work: Any) -> Any:
        """Run `work` (a coroutine, or a function of no arguments) on the server's loop."""
        if not asyncio.iscoroutine(work):
            fn = work

            async def call() -> Any:
                return fn()

            work = call()
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(ON_LOOP_TIMEOUT)

    def start(self) -> None:
        """Nothing to start: the server's workers are the queue's."""

    def idle(self) -> Slot | None:
        """A place in the queue for one more job, or None while it is full."""
        room = self._on_loop(lambda: self.queue.room("precompile"))
        return Slot(os.getpid()) if room > 0 else None

    def submit(self, slot: Slot, job: FileJob, path: Path, stat: Any) -> None:
        slot.job = job
        with self._lock:
            self.workers.append(slot)
        self._on_loop(lambda: self._queue(slot, Path(path), dict(stat.__dict__)))

    def _queue(self, slot: Slot, path: Path, stat: dict) -> None:
        """On the loop: the server's job for the file, named as its catalog entry."""
        from pipeline.personas import DEFAULT
        from watcher.reconcile import source_at

        rel = path.relative_to(self.root).as_posix()
        src = source_at(self.root, rel)
        persona, attire, motion = (
            (src.persona, src.attire, None if src.motion == DEFAULT else src.motion)
            if src is not None
            else (rel.split("/", 1)[0], Path(rel).stem, None)  # gone meanwhile: it fails
        )
        config = self.service.config
        queued = Job(
            new_id(config.replica),
            "precompile",
            persona,
            attire,
            motion,
            config.settings.renderer,
            time.time(),
            owner=OWNER,
        )
        fields = {"persona": persona, "attire": attire, "motion": motion}
        try:
            self.queue.submit(
                queued, {**fields, "source": str(path), "stat": stat}, slot.job.recipe
            )
        except Problem as refused:  # filled by the API since idle() saw room: a retry later
            self._arrive(slot, Outcome(slot.job, "cancelled", f"refused: {refused.detail}"))
            return
        slot.queued = queued
        self.queue.on_end[queued.id] = lambda ended, result: self._ended(slot, ended, result)

    def _ended(self, slot: Slot, queued: Job, result: dict) -> None:
        """On the loop, from the queue: the job ended; its outcome, as a worker's."""
        if slot.abandoned:
            with self._lock:
                self.workers.remove(slot)
            return
        job = slot.job
        if queued.state == "done":
            outcome = Outcome(job, "ok", result)
        elif queued.state == "failed":  # 409: the file changed (workers.precompile_file)
            outcome = Outcome(job, "changed" if queued.status == 409 else "error", queued.error)
        elif slot.killed_because:  # past --job-timeout: the file's time, a failed attempt
            outcome = Outcome(job, "died", slot.killed_because)
        else:  # cancelled or interrupted (a DELETE, a drain): nothing wrong with the file;
            # it runs again, and the attempt is not counted (watcher/outcomes.py)
            why = queued.error or f"server job {queued.id} {queued.state}"
            outcome = Outcome(job, "cancelled", why)
        self._arrive(slot, outcome)

    def _arrive(self, slot: Slot, outcome: Outcome) -> None:
        with self._lock:
            if slot in self.workers:
                self.workers.remove(slot)
            self._arrived.append(outcome)
        self._writer.send_bytes(b".")  # wakes the daemon's wait

    def waitables(self) -> list[Any]:
        return [self._reader]

    def poll(self) -> list[Outcome]:
        """The outcomes that arrived since the last poll."""
        while self._reader.poll():
            self._reader.recv_bytes()
        with self._lock:
            arrived, self._arrived = self._arrived, []
        return arrived

    def kill_overdue(self, limit: float, now: float) -> list[FileJob]:
        """Cancel the jobs running longer than limit seconds (0 = no limit), counted from
        their start on a worker, not their time in the queue; poll() reports each."""
        overdue = []
        with self._lock:
            slots = list(self.workers)
        for slot in slots:
            queued = slot.queued
            if limit <= 0 or queued is None or slot.killed_because:
                continue
            if queued.state == "running" and time.time() - (queued.started or 0) > limit:
                slot.killed_because = (
                    f"timed out after {limit:g} s (server job {queued.id} cancelled)"
                )
                self._on_loop(self.queue.cancel(queued, slot.killed_because))
                overdue.append(slot.job)
        return overdue

    def stop(self, grace: float) -> list[Outcome]:
        """The watcher stops (before the server drains): what it queued leaves the queue
        at once; what runs is left to the server's drain, which lets it finish. Returns
        the outcomes that arrived; the daemon records the rest as abandoned, and its next
        start finds them hot or queues them again. `grace` is the drain's business here."""
        with self._lock:
            slots = list(self.workers)
        for slot in slots:
            slot.abandoned = True
            queued = slot.queued
            if queued is not None and queued.state == "queued":
                self._on_loop(self.queue.cancel(queued, "the server's watcher stopped"))
        return self.poll()


class Watching:
    """The daemon on its thread, started and stopped with the server."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.daemon: Any = None
        self.thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        from watcher.daemon import Config, Daemon
        from watcher.log import Log

        s = self.service.config.settings
        config = Config(
            personas=s.personas,
            cache=s.cache,
            recipe=s.recipe,
            workers=self.service.config.workers,
            map_size=s.map_size,
            flight_wait=s.flight_wait,
        )
        pool = QueuePool(self.service, loop)
        self.daemon = Daemon(config, log=Log(stream=sys.stdout), pool=pool, what=SERVER_WATCH)
        self.thread = threading.Thread(target=self._run, name="hotplate-watcher", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from watcher.process import one_line

        try:
            self.daemon.run()
        except Exception as exc:  # the server goes on serving what is hot
            print(f"hotplate serve: the watcher stopped: {one_line(exc)}", flush=True)

    async def stop(self) -> None:
        """Stop the daemon and wait for its thread (idempotent)."""
        if self.thread is None:
            return
        self.daemon.stop()
        await asyncio.to_thread(self.thread.join)
        self.thread = None
