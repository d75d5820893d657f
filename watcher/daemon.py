"""The watcher daemon: events -> settle -> hash -> job -> worker, and `sync`'s one shot.

One thread runs the loop; the observer thread only enqueues (watcher/events.py) and
the precompiles run in spawned worker processes (watcher/jobs.py). Each turn:

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
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from cachestore.hashcache import file_digest, remember
from cachestore.keys import FileChangedError, FileStat
from cachestore.store import Store, open_store
from pipeline.catalog import Source
from pipeline.personas import read_options
from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe
from watcher import health
from watcher.events import (
    CLOSED,
    CREATED,
    DELETED,
    DIR_CREATED,
    DIR_DELETED,
    DIR_MOVED,
    IGNORED,
    MODIFIED,
    MOVED,
    OVERFLOW,
    Change,
    ChangeQueue,
    EnqueueHandler,
    OverflowSignal,
    judge,
    start_observer,
)
from watcher.jobs import Job, JobQueue, Outcome, WorkerPool, backoff_delay
from watcher.log import quiet
from watcher.reconcile import persona_sources, rel_of, scan, source_at
from watcher.settle import Settler
from watcher.sources import (
    FAILED,
    HOT,
    QUEUED,
    RETRY,
    RUNNING,
    delete_rows,
    load_rows,
    new_row,
    put_rows,
    row_stat,
    same_file,
    stat_of,
)
from watcher.worker import DEFAULT_JOB

MAX_ERRORS = 10  # last errors kept for the heartbeat


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


@dataclass
class Summary:
    done: int = 0  # jobs that made an avatar hot
    failed: int = 0  # jobs given up
    unchanged: int = 0  # sources hot already at the last reconcile
    failed_before: dict[str, str] = field(default_factory=dict)  # rel -> error, left alone
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # rel -> final state


class WatcherError(RuntimeError):
    """The daemon cannot go on (its folder vanished); a service manager should restart it."""


class Daemon:
    """The watcher. Not reusable: one `run()` per instance."""

    def __init__(self, config: Config, log: Any = quiet) -> None:
        self.c = config
        self.log = log
        self.root = Path(config.personas).resolve()
        self.cache = Path(config.cache)
        self.queue = ChangeQueue()
        self.jobs = JobQueue()
        self.pool = WorkerPool(config.workers, self.cache, config.job, config.map_size)
        self.lock = health.Lock(self.cache)
        self.summary = Summary()
        self.mode = "scan" if config.once else ""
        self.started = time.time()
        self.retried = 0
        self.errors: deque[dict[str, Any]] = deque(maxlen=MAX_ERRORS)
        self.store: Store | None = None
        self.settler: Settler | None = None
        self.observer: Any = None
        self._stop = threading.Event()
        self._hurry = False
        self._fatal = ""
        self._recipes: dict[str, tuple[Any, Recipe]] = {}
        self._avatars: dict[tuple[str, Recipe], str] = {}
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
        what = "hotplate sync" if c.once else "hotplate watch"
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
            self._dispatch()
            if self.c.once and not self.settler and not self.jobs:
                return
            timeout = self._timeout()
            wait([self.queue, *self.pool.waitables()], timeout)
            for change in self.queue.drain():
                self._guard(self._on_change, change)
            for outcome in self.pool.poll():
                self._guard(self._on_outcome, outcome)
            ready, vanished = self.settler.due()
            for rel in vanished:
                self._guard(self._gone, rel, "vanished before it settled")
            for rel in ready:
                self._guard(self._ready, rel)
            self._tick()

    def _guard(self, fn: Any, *args: Any) -> None:
        """One path's trouble is logged, never the end of the daemon."""
        from watcher.jobs import WorkerFatalError

        try:
            fn(*args)
        except WorkerFatalError:
            raise
        except Exception as exc:
            where = args[0] if args and isinstance(args[0], str) else ""
            self.log("warning", where, f"internal error, skipped: {type(exc).__name__}: {exc}")

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
            for outcome in self.pool.stop(grace):
                self._guard(self._on_outcome, outcome)
            for job in self.jobs.running:
                self._set_rows(job, state=QUEUED, error="abandoned when the daemon stopped")
                self.log(
                    "stop", job.path, f"job {job.id} abandoned; it runs again at the next start"
                )
            if self.store is not None and not self.c.once:
                self.heartbeat(stopped=time.time())
            elif self.store is not None:
                self._write_sync_record()
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
        self._avatars.clear()  # models may have changed: recompute identities once per scan
        found = scan(self.root, self.store, self._avatar_of, self.c.retry_failed, under)
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
        self._touch(found.hot + found.failed)
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

    def _touch(self, rels: list[str]) -> None:
        if not rels:
            return
        rows = load_rows(self.store, self.root)
        now = time.time()
        put_rows(self.store, {r: {**rows[r], "last_seen": now} for r in rels if r in rows})

    # -- recipes and keys -------------------------------------------------------------

    def _recipe_for(self, persona: str) -> Recipe:
        """The settings' recipe with persona.toml's bbox_shift, as `hotplate render` uses."""
        toml = self.root / persona / "persona.toml"
        try:
            st = os.stat(toml)
            key: Any = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        cached = self._recipes.get(persona)
        if cached is not None and cached[0] == key:
            return cached[1]
        options = read_options(self.root, persona) if key is not None else {}
        recipe = self.c.recipe.for_persona(options, str(toml))
        self._recipes[persona] = (key, recipe)
        return recipe

    def _avatar(self, digest: str, recipe: Recipe) -> str:
        key = (digest, recipe)
        if key not in self._avatars:
            self._avatars[key] = plan(digest, recipe).avatar
        return self._avatars[key]

    def _avatar_of(self, src: Source, digest: str) -> str:
        return self._avatar(digest, self._recipe_for(src.persona))

    # -- changes ------------------------------------------------------------------------

    def _on_change(self, ch: Change) -> None:
        kind = ch.kind
        if kind == IGNORED:
            self.log("ignore", ch.path, ch.reason)
        elif kind == OVERFLOW:
            self.log("warning", msg="the kernel dropped file events (overflow); reconciling")
            self._next_rescan = 0.0
        elif kind in (CREATED, MODIFIED, CLOSED):
            if self.settler.note(ch.path, closed=kind == CLOSED):
                wait_for = (
                    "still" if kind == CLOSED or self.mode != "inotify" else "closed and still"
                )
                self.log("settle", ch.path, f"{kind}; waiting until it is {wait_for}")
        elif kind == DELETED:
            self._gone(ch.path, "deleted")
        elif kind == MOVED:
            self._moved(ch.path, ch.dest)
        elif kind == DIR_CREATED:
            self._arrived_dir(ch.path, closed=False)
        elif kind == DIR_MOVED:
            if ch.path and not ch.dest:
                self._gone_under(ch.path, "moved out of the folder")
            elif ch.dest and not ch.path:
                self._arrived_dir(ch.dest, closed=True)
            # a rename inside the tree: watchdog reports each file's move after this
        elif kind == DIR_DELETED and not ch.path:
            self._fatal = (
                f"the personas folder {self.root} was deleted or moved away; nothing is watched "
                f"any more, so the watcher stops (start it again once the folder is back)"
            )
            self.log("warning", msg=self._fatal)
            self.stop()
        elif kind == DIR_DELETED:
            self._gone_under(ch.path, "deleted")

    def _gone(self, rel: str, why: str) -> None:
        self.settler.forget(rel)
        job = self.jobs.remove_path(rel)
        dropped = delete_rows(self.store, [rel])
        if judge(rel).kind == "options":
            self._options_changed(rel)
            return
        extra = f"; left job {job.id}" if job else ""
        self.log("gone", rel, f"{why}{'; row dropped' if dropped else ''}{extra}")

    def _gone_under(self, prefix: str, why: str) -> None:
        def below(rel: str) -> bool:
            return not prefix or rel.startswith(prefix + "/")

        self.settler.forget_under(prefix)
        for job in list(self.jobs.jobs.values()):
            for rel in [r for r in job.paths if below(r)]:
                self.jobs.remove_path(rel)
        rows = [r for r in load_rows(self.store, self.root) if below(r)]
        delete_rows(self.store, rows)
        self.log("gone", prefix + "/", f"{why}; {len(rows)} source rows dropped")

    def _moved(self, src: str, dest: str) -> None:
        row = self.store.read_value("source", src) if src else None
        if src:
            self._gone(src, f"renamed to {dest}" if dest else "moved out of the folder")
        if not dest:
            return
        path = self.root / dest
        try:
            stat = stat_of(path)
        except OSError:
            return
        old = row_stat(row) if isinstance(row, dict) else None
        if old is not None and row.get("digest") and same_file(old, stat):
            # the same bytes under a new name: seed the stat cache, hash nothing
            remember(self.store, path, stat, row["digest"])
            self.settler.note(dest, closed=True, quiet_since=0.0)
            self.log("moved", dest, f"from {src}: same content, not rehashed")
        elif self.settler.note(dest, closed=True):
            self.log("settle", dest, "moved into place; waiting until it is still")

    def _arrived_dir(self, rel_dir: str, closed: bool) -> None:
        """A folder appeared (mkdir, or moved in whole): note every source in it."""
        found = 0
        for dirpath, dirnames, filenames in os.walk(self.root / rel_dir):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                rel = rel_of(self.root, Path(dirpath) / name)
                if judge(rel).kind is not None:
                    self.settler.note(rel, closed=closed)
                    found += 1
        how = "moved in" if closed else "created"
        self.log("settle", rel_dir + "/", f"folder {how}; {found} files waiting until still")

    def _options_changed(self, rel: str) -> None:
        persona = rel.split("/", 1)[0]
        self._recipes.pop(persona, None)
        try:
            sources = list(persona_sources(self.root, persona))
        except OSError:
            sources = []
        for src in sources:
            self.settler.note(rel_of(self.root, src.path), closed=True, quiet_since=0.0)
        self.log("settle", rel, f"persona options changed; rechecking {len(sources)} sources")

    # -- ready: hash and queue ----------------------------------------------------------

    def _ready(self, rel: str) -> None:
        if judge(rel).kind == "options":
            self._options_changed(rel)
            return
        src = source_at(self.root, rel)
        if src is None:
            self.jobs.remove_path(rel)
            delete_rows(self.store, [rel])
            self.log(
                "ignore", rel, "not a source in the catalog (a same-named still wins, or gone)"
            )
            return
        path = self.root / rel
        try:
            before = stat_of(path)
            digest = file_digest(self.store, path)
            after = stat_of(path)
        except FileChangedError:
            self.settler.note(rel)
            self.log("settle", rel, "changed while it was hashed; waiting until it is still")
            return
        except FileNotFoundError:
            self._gone(rel, "vanished before it was hashed")
            return
        except OSError as exc:
            self._fail_row(rel, src, f"cannot read it ({exc.strerror}); fix its permissions")
            return
        if before != after:
            self.settler.note(rel)
            self.log("settle", rel, "changed while it was hashed; waiting until it is still")
            return
        try:
            recipe = self._recipe_for(src.persona)
            avatar = self._avatar(digest, recipe)
        except (ValueError, LookupError, OSError) as exc:  # bad persona.toml, missing weights
            self._fail_row(rel, src, f"{type(exc).__name__}: {exc}", stat=after, digest=digest)
            return
        if self.store.get_avatar(avatar) is not None:
            self.jobs.remove_path(rel)
            put_rows(self.store, {rel: new_row(self.root, src, after, digest, avatar, HOT)})
            self._result(rel, src, HOT, None, "")
            self.log("hot", rel, f"content {digest[:12]} is hot already; nothing to precompile")
            return
        job, created = self.jobs.add(avatar, digest, recipe, rel, after)
        row = new_row(self.root, src, after, digest, avatar, RUNNING if job.running else QUEUED)
        row["attempts"] = job.attempts
        put_rows(self.store, {rel: row})
        if created:
            self.log("queued", rel, f"job {job.id} for content {digest[:12]}", job=job.id)
        else:
            first = next(iter(job.paths))
            self.log("queued", rel, f"joins job {job.id}: same content as {first}", job=job.id)

    def _fail_row(
        self, rel: str, src: Source, error: str, stat: FileStat | None = None, digest: str = ""
    ) -> None:
        try:
            stat = stat or stat_of(self.root / rel)
        except OSError:
            return
        row = new_row(self.root, src, stat, digest, "", FAILED)
        row["error"] = error
        put_rows(self.store, {rel: row})
        self._error(rel, error, 1, final=True)
        self._result(rel, src, FAILED, None, error)
        self.summary.failed += 1
        self.log("job-failed", rel, error)

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

    def _write_sync_record(self) -> None:
        results = self.summary.results
        errors = [
            {"path": r, "error": v["error"]} for r, v in results.items() if v["state"] == FAILED
        ]
        health.write_json(
            self.cache / health.SYNC_FILE,
            {
                "time": time.time(),
                "personas": str(self.root),
                "hot": sum(v["state"] == HOT for v in results.values()),
                "failed": len(errors),
                "unchanged": self.summary.unchanged,
                "errors": errors[:20],
            },
        )

    # -- health -----------------------------------------------------------------------------

    def heartbeat(self, stopped: float | None = None) -> None:
        counts: dict[str, int] = {}
        for row in load_rows(self.store, self.root).values():
            counts[row.get("state", "?")] = counts.get(row.get("state", "?"), 0) + 1
        record = {
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
            "retried": self.retried,
            "sources": counts,
            "errors": list(self.errors),
        }
        if stopped is not None:
            record["stopped"] = stopped
        health.write_heartbeat(self.cache, record)
