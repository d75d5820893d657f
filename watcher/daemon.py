"""The watcher daemon: events -> settle -> hash -> job -> worker, and `sync`'s one shot.

One thread runs the loop; the observer thread only enqueues (watcher/events.py) and
the precompiles run in spawned worker processes (watcher/jobs.py). The loop owns the life
cycle, signals and deadlines; the work of each step is in its own room: the intake
(watcher/intake.py: changes, settle, hash, hot or a job), the keys memo (watcher/keys.py),
the outcomes (watcher/outcomes.py: dispatch, rows, summary) and the health records
(watcher/health.py). Each turn:

    1. wait for a change, a worker message, a worker exit or the next deadline
    2. apply the changes: settle what was written, drop what was deleted, carry
       renames over without rehashing
    3. take what has settled: hash it (stat cache first), and either mark it hot (its
       content is hot already) or queue a job, deduplicated by avatar key
    4. record job outcomes in the `source` table; retry failures with backoff
    5. hand waiting jobs to idle workers
    6. heartbeat; reconcile against the folder every --rescan minutes

`Daemon(config).run()` returns when stopped (SIGTERM, SIGINT, `stop()`) or, with
`config.once` (`hotplate sync`), when nothing is outstanding.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from cachestore.flight import DEFAULT_WAIT
from cachestore.hashcache import remember
from cachestore.store import Store, open_store
from pipeline.precompile.recipe import Recipe
from watcher import health
from watcher.events import (
    ChangeQueue,
    EnqueueHandler,
    OverflowSignal,
    start_observer,
)
from watcher.intake import RESCAN, STOP, Intake, Verdict
from watcher.jobs import JobQueue, WorkerPool
from watcher.keys import Keys
from watcher.log import quiet
from watcher.outcomes import Outcomes, Summary
from watcher.reconcile import scan
from watcher.settle import Settler
from watcher.sources import (
    QUEUED,
    delete_rows,
    load_rows,
    stat_of,
)
from watcher.worker import DEFAULT_JOB


@dataclass
class Config:
    personas: Path
    cache: Path
    recipe: Recipe = field(default_factory=Recipe)
    settle: float = 2.0  # seconds a file must be quiet (after its close, on Linux)
    rescan: float = 10.0  # minutes between reconciles; 0 = only at start
    workers: int = 1
    polling: bool = False
    poll_interval: float = 1.0
    retries: int = 3  # attempts per content before it is reported failed
    backoff: float = 5.0  # seconds before the second attempt; doubles after
    job: str = DEFAULT_JOB  # "module:function" run by the workers (tests inject one)
    once: bool = False  # `hotplate sync`: no observer; return when nothing is outstanding
    retry_failed: bool = False  # requeue files that failed before though unchanged
    stop_grace: float = 2.0  # seconds a running job may finish after SIGTERM
    job_timeout: float = 3600.0  # seconds before a job's worker is killed (0 = never)
    open_grace: float | None = None  # unclosed-but-still fallback; default max(4 settle, 2 s)
    map_size: int | None = None  # the store's initial map (the `map_size` setting)
    flight_wait: float = DEFAULT_WAIT  # seconds a job waits for another build of its avatar

    def check(self) -> None:
        """Raise ValueError naming the setting, the value and the fix."""
        if not Path(self.personas).is_dir():
            raise ValueError(
                f"personas folder {self.personas} does not exist or is not a folder; "
                f"create it or pass --personas"
            )
        limits = ("settle", "rescan", "backoff", "stop_grace", "job_timeout")
        for name, low in ((n, 0) for n in limits):
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)} must be >= {low}")
        if self.workers < 1:
            raise ValueError(f"workers={self.workers} must be >= 1")
        if self.retries < 1:
            raise ValueError(f"retries={self.retries} must be >= 1")
        self.recipe.check()


class WatcherError(RuntimeError):
    """The daemon cannot go on (its folder vanished); a service manager should restart it."""


class Daemon:
    """The watcher. Not reusable: one `run()` per instance."""

    def __init__(self, config: Config, log: Any = quiet, pool: Any = None, what: str = "") -> None:
        """`pool`: what runs the jobs (default: a WorkerPool of config.workers processes;
        `hotplate serve --watch` passes its queue's, hotplate/serve/watching.py); `what`:
        the name the lock and the log give the daemon."""
        self.c = config
        self.log = log
        self.root = Path(config.personas).resolve()
        self.cache = Path(config.cache)
        self.queue = ChangeQueue()
        self.jobs = JobQueue()
        self.pool = pool or WorkerPool(
            config.workers, self.cache, config.job, config.map_size, config.flight_wait
        )
        self.what = what or ("hotplate sync" if config.once else "hotplate watch")
        self.lock = health.Lock(self.cache)
        self.summary = Summary()
        self.keys = Keys(self.root, config.recipe)
        self.mode = "scan" if config.once else ""
        self.started = time.time()
        self.store: Store | None = None
        self.settler: Settler | None = None
        self.outcomes: Outcomes | None = None  # made once the store is open
        self.intake: Intake | None = None
        self.observer: Any = None
        self._stop = threading.Event()
        self._hurry = False
        self._fatal = ""
        self._next_beat = 0.0
        self._next_rescan = float("inf")
        self._old_signals: dict[int, Any] = {}
        self._overflow: OverflowSignal | None = None

    # -- life cycle -------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish (thread- and signal-safe)."""
        if self._stop.is_set():
            self._hurry = True  # a second signal: abandon running jobs at once
        self._stop.set()
        self.queue.wake()

    def run(self) -> Summary:
        c = self.c
        # 1. check inputs, take the lock
        what = self.what
        try:
            c.check()
            self.lock.acquire(
                {"what": what, "personas": str(self.root), "started": self.started}, what=what
            )
        except BaseException:
            self.queue.close()
            raise
        try:
            self._install_signals()
            self.store = open_store(self.cache, map_size=c.map_size)
            # 2. observe first, so nothing written during the first scan is missed
            warning = ""
            if not c.once:
                handler = EnqueueHandler(self.root, self.queue)
                self.observer, self.mode, warning = start_observer(
                    self.root, handler, c.polling, c.poll_interval
                )
                self._overflow = OverflowSignal(self.queue)
                logging.getLogger("watchdog.observers.inotify").addHandler(self._overflow)
            self.settler = Settler(
                self.root, c.settle, need_close=self.mode == "inotify", open_grace=c.open_grace
            )
            self.outcomes = Outcomes(
                self.root,
                self.store,
                self.jobs,
                self.pool,
                self.settler,
                c.retries,
                c.backoff,
                self.summary,
                self.log,
            )
            self.intake = Intake(
                self.root, self.store, self.settler, self.jobs, self.keys, self.outcomes, self.log
            )
            # 3. workers start (spawn, imports) while the folder is scanned; sync starts
            #    them only if there is work
            if not c.once:
                self.pool.start()
            self.log(
                "start",
                msg=f"{what} on {self.root} ({self.mode}, settle {c.settle:g} s, "
                f"{c.workers} worker{'s' if c.workers > 1 else ''}, pid {os.getpid()})",
                mode=self.mode,
                pid=os.getpid(),
            )
            if warning:
                self.log("warning", msg=warning)
            self.reconcile()
            if c.rescan > 0 and not c.once:
                self._next_rescan = time.monotonic() + c.rescan * 60
            self._loop()
        finally:
            self._shutdown()
        if self._fatal:
            raise WatcherError(self._fatal)
        return self.summary

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.outcomes.dispatch()
            if self.c.once and not self.settler and not self.jobs:
                return
            timeout = self._timeout()
            wait([self.queue, *self.pool.waitables()], timeout)
            for change in self.queue.drain():
                self._obey(self._guard(self.intake.on_change, change))
            for outcome in self.pool.poll():
                self._guard(self.outcomes.on_outcome, outcome)
            ready, vanished = self.settler.due()
            for rel in vanished:
                self._guard(self.intake.gone, rel, "vanished before it settled")
            for rel in ready:
                self._guard(self.intake.ready, rel)
            self._tick()

    def _obey(self, verdict: Verdict | None) -> None:
        """Do what the intake asked of the loop."""
        if verdict is None:
            return
        self.log("warning", msg=verdict.reason)
        if verdict.action == RESCAN:
            self._next_rescan = 0.0
        elif verdict.action == STOP:
            self._fatal = verdict.reason
            self.stop()

    def _guard(self, fn: Any, *args: Any) -> Any:
        """One path's trouble is logged, never the end of the daemon."""
        from watcher.jobs import WorkerFatalError

        try:
            return fn(*args)
        except WorkerFatalError:
            raise
        except Exception as exc:
            where = args[0] if args and isinstance(args[0], str) else ""
            self.log("warning", where, f"internal error, skipped: {type(exc).__name__}: {exc}")
            return None

    def _timeout(self) -> float:
        now = time.monotonic()
        times = [self._next_rescan, now + health.HEARTBEAT_EVERY]
        if not self.c.once:
            times.append(self._next_beat)
        for t in (self.settler.next_deadline(), self.jobs.next_ready_at()):
            if t is not None:
                times.append(t)
        return min(max(min(times) - now, 0.0), health.HEARTBEAT_EVERY)

    def _tick(self) -> None:
        now = time.monotonic()
        for job in self.pool.kill_overdue(self.c.job_timeout, now):
            self.log("warning", job.path, f"job {job.id} ran past {self.c.job_timeout:g} s; killed")
        if now >= self._next_rescan:
            self._next_rescan = now + self.c.rescan * 60 if self.c.rescan > 0 else float("inf")
            self.reconcile()
        if not self.c.once and now >= self._next_beat:
            self._next_beat = now + health.HEARTBEAT_EVERY
            self.heartbeat()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # tests run the daemon in a thread and call stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old_signals[sig] = signal.signal(sig, lambda *_: self.stop())

    def _shutdown(self) -> None:
        stopping = time.monotonic()
        if self.observer is not None:
            self.observer.stop()
        if self._overflow is not None:
            logging.getLogger("watchdog.observers.inotify").removeHandler(self._overflow)
        try:
            grace = 0.0 if self._hurry else self.c.stop_grace
            outcomes = self.pool.stop(grace)
            if self.outcomes is not None:  # else the store never opened: no rows, no records
                for outcome in outcomes:
                    self._guard(self.outcomes.on_outcome, outcome)
                for job in self.jobs.running:
                    self.outcomes.set_rows(
                        job, state=QUEUED, error="abandoned when the daemon stopped"
                    )
                    self.log(
                        "stop", job.path, f"job {job.id} abandoned; it runs again at the next start"
                    )
                if not self.c.once:
                    self.heartbeat(stopped=time.time())
                else:
                    health.write_sync(
                        self.cache, self.root, self.summary.results, self.summary.unchanged
                    )
        finally:
            if self.observer is not None:
                self.observer.join(timeout=2)
            for sig, old in self._old_signals.items():
                signal.signal(sig, old)
            self.lock.release()
            self.queue.close()
        if not self.c.once:
            self.log(
                "stop",
                msg=f"stopped in {time.monotonic() - stopping:.1f} s; "
                f"{self.summary.done} jobs done, {self.summary.failed} failed",
            )

    # -- reconcile ----------------------------------------------------------------------

    def reconcile(self, under: str = "") -> None:
        """Queue what the folder has that the table does not know hot; drop what is gone."""
        self.keys.new_scan()
        found = scan(self.root, self.store, self.keys.avatar_of, self.c.retry_failed, under)
        for rel in found.gone:
            self.settler.forget(rel)
            self.jobs.remove_path(rel)
        delete_rows(self.store, found.gone)
        now_mono, now_wall = time.monotonic(), time.time()
        queued = 0
        for item in found.outstanding:
            if item.rel in self.settler or self.jobs.job_of(item.rel) is not None:
                continue  # already on its way
            if item.rel in found.moved and item.digest:
                try:
                    remember(self.store, item.source.path, stat_of(item.source.path), item.digest)
                except OSError:
                    pass
            quiet_since = now_mono - max(0.0, now_wall - item.quiet_since)
            self.settler.note(item.rel, closed=True, quiet_since=quiet_since)
            queued += 1
        self.outcomes.touch(found.hot + found.failed)
        self.summary.unchanged = len(found.hot)
        if found.failed:
            rows = load_rows(self.store, self.root)
            self.summary.failed_before = {r: rows.get(r, {}).get("error", "") for r in found.failed}
        total = len(found.hot) + len(found.failed) + len(found.outstanding)
        self.log(
            "reconcile",
            under,
            f"{total} sources: {len(found.hot)} hot, {queued} to check, {len(found.gone)} gone, "
            f"{len(found.moved)} renamed, {len(found.failed)} failed before (left until they "
            f"change) in {found.seconds:.2f} s",
            hot=len(found.hot),
            outstanding=queued,
            gone=len(found.gone),
            moved=len(found.moved),
            failed=len(found.failed),
        )

    def heartbeat(self, stopped: float | None = None) -> None:
        """Write daemon.json (what `hotplate status` reads)."""
        o = self.outcomes
        figures = {
            "pid": os.getpid(),
            "started": self.started,
            "personas": str(self.root),
            "cache": str(self.cache),
            "mode": self.mode,
            "settle": self.c.settle,
            "workers": self.c.workers,
            "worker_pids": [w.pid for w in self.pool.workers],
            "queue": {
                "running": len(self.jobs.running),
                "waiting": len(self.jobs.waiting),
                "settling": len(self.settler) if self.settler else 0,
            },
            "done": self.summary.done,
            "failed": self.summary.failed,
            "retried": o.retried if o else 0,
            "errors": list(o.errors) if o else [],
        }
        health.beat(self.cache, figures, load_rows(self.store, self.root).values(), stopped)
