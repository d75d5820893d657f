"""The job queue the render workers serve (records in records.py, admission in admission.py).

Jobs wait in arrival order; a free worker takes the first one, an editor's (render,
stream, live) before any background precompile, skipping a client that already holds
its share of workers (`cap`, `--max-per-client`). `admit` refuses an editor's work a
worker would not start within `max_wait` (admission.py says how that is estimated), or
past `size` waiting; background work (a precompile, which nobody waits on) is not held
to `max_wait`: it queues up to `background_size` avatars, and only a full background
queue refuses one. A drain starts nothing more: what is queued then is answered 503. Before it says it
is ready, every worker renders a warm-up clip of each avatar size the store holds hot,
which seeds the estimate (workers.warm_up_renders).

A render that builds its avatar just in time takes the precompiles queued for the same
avatar (the same persona, attire, motion, renderer and recipe) out of the queue: they
ride on it (`running`, step "built by render job ...") and end with it, done with its
avatar; should the render fail or be cancelled, they go back to the head of the queue.
Without it the flight lock already made the build one, but each queued precompile still
held a worker later to find the avatar hot.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hotplate.serve.admission import (
    TICKET,
    Busy,
    Cost,
    ServiceTimes,
    Slot,
    Ticket,
    default_motion,
    expected_start,
    priority_of,
    whole_seconds,
)
from hotplate.serve.metrics import Metrics
from hotplate.serve.problems import Problem
from hotplate.serve.records import (
    CANCELLABLE,
    Job,
    JobRecords,
    Retention,
    remove,
    snapshot,
    sweep_orphans,
)
from hotplate.serve.workers import RenderWorker

Entry = tuple[Job, dict, Any]  # a job, its request's fields, its recipe
# How often an idle worker is looked at: one that died while idle is replaced then, not
# found dead by the next job (a 500), and /readyz is 200 again without a job to wake it.
IDLE_CHECK = 1.0  # seconds


class JobQueue:
    """The queue served by N render workers (module doc); every state change is saved
    and wakes whoever waits on it (the one-shot route, the SSE stream)."""

    def __init__(
        self,
        records: JobRecords,
        worker_settings: dict[str, Any],
        workers: int,
        size: int,
        metrics: Metrics | None = None,
        retention: Retention | None = None,
        max_wait: float | None = None,
        cap: int | None = None,
        renderer: str = "warp",
        warm_up: Any = None,
        clock: Callable[[], float] = time.time,
        background_size: int = 64,
    ) -> None:
        """`renderer`: the server's default (a request's renderer is not known before its
        form is read); `warm_up`: the recipe for the workers' warm-up renders (None: no
        warm-up); `clock`: wall seconds, for jobs' times and the estimates."""
        self.records, self.worker_settings = records, worker_settings
        self.renderer, self.warm_up, self.clock = renderer, warm_up, clock
        self.n_workers, self.size, self.background_size = workers, size, background_size
        self.max_wait, self.cap = max_wait, cap or workers
        self.live: dict[str, Job] = {}  # queued or running
        self.waiting: list[Entry] = []  # in arrival order; _take applies the priorities
        self.tickets: list[Ticket] = []  # admitted requests whose job is not queued yet
        self.work = asyncio.Event()  # set when a worker might find something to take
        self.changed = asyncio.Condition()
        self.workers: list[RenderWorker] = []
        self.running: dict[str, RenderWorker] = {}
        self.riders: dict[str, list[Entry]] = {}  # a JIT render's id: precompiles it builds
        # a job's id: told its end (the job, its result) once, whichever way it ends;
        # the server's watcher hears of its precompiles so (watching.py)
        self.on_end: dict[str, Callable[[Job, dict], None]] = {}
        self.ready = False
        self.draining_until: float | None = None  # set by drain(): admit nothing more
        self.in_flight = 0  # admitted requests whose answer has not ended (admission.py)
        self._pending: set[asyncio.Task] = set()
        self.metrics = metrics or Metrics()
        self.times = ServiceTimes()
        self.retention = retention or Retention(86400.0, records.path.parent)
        self.threads = ThreadPoolExecutor(max_workers=workers + 1, thread_name_prefix="render")
        self.tasks: list[asyncio.Task] = []

    # -- lifecycle --------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.workers = [RenderWorker(self.worker_settings) for _ in range(self.n_workers)]
        await asyncio.gather(*(loop.run_in_executor(self.threads, w.start) for w in self.workers))
        if self.warm_up is not None:
            spec, began = {"backend": self.renderer}, time.monotonic()
            runs = [
                loop.run_in_executor(self.threads, w.warm_up_renders, spec, self.warm_up)
                for w in self.workers
            ]
            self.seed([r for rs in await asyncio.gather(*runs) for r in rs])
            print(f"hotplate serve: warm-up took {time.monotonic() - began:.1f} s", flush=True)
        self.tasks = [asyncio.create_task(self._serve(w)) for w in self.workers]
        self.ready = True

    def seed(self, renders: list[dict]) -> None:
        """The workers' warm-up renders (all at once, as a burst runs them): each size's
        cost, averaged over the workers (workers.warm_up_renders)."""
        by_size: dict[tuple, list[Cost]] = {}
        for r in renders:
            cost = Cost.measured(r["seconds"], r["audio_seconds"], r["first_frame_seconds"])
            by_size.setdefault((r["backend"], r["size"], tuple(r["names"])), []).append(cost)
        for (backend, size, names), costs in by_size.items():
            mean = Cost(
                sum(c.overhead for c in costs) / len(costs), sum(c.rate for c in costs) / len(costs)
            )
            self.times.seed(backend, size, mean, names)
            print(
                f"hotplate serve: warm-up render, {backend} {size}: {mean.overhead:.2f} s "
                f"+ {mean.rate:.2f} s per second of audio",
                flush=True,
            )

    async def stop(self) -> None:
        """The clean end (after a drain, or when the app shuts down): workers asked to
        exit, and what is left recorded as interrupted, its files removed."""
        self.ready = False
        for task in self.tasks:
            task.cancel()
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(None, w.stop) for w in self.workers), return_exceptions=True
        )
        self._interrupted("the server stopped before this job finished")
        self.threads.shutdown(wait=False, cancel_futures=True)

    async def drained(self, timeout: float) -> bool:
        """Wait until no job is queued or running and no admitted request is still being
        answered (the last bytes of a stream, a blocking render's MP4), for up to
        `timeout` seconds; returns whether that happened."""
        async with self.changed:
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: not self.live and self.in_flight <= 0),
                    timeout,
                )
                return True
            except TimeoutError:
                return False

    async def begin_drain(self, seconds: float) -> int:
        """Admit nothing more and start nothing more: the jobs still queued are answered now
        (503, submit again: a blocked /v1/lip-sync gets it while the server still
        answers), the running ones have `seconds` to finish. Returns how many were queued."""
        self.draining_until = time.monotonic() + seconds
        queued = [job for job, _, _ in self.waiting if job.state == "queued"]
        for job in queued:
            job.state, job.status, job.finished = "interrupted", 503, time.time()
            job.error = "the server is shutting down (a restart or deploy); submit it again"
            remove(job.audio, job.audio and job.audio + ".part")
            job.audio = None
            self.metrics.renders.labels("interrupted").inc()
            self.live.pop(job.id, None)
            self.records.save(job)
            self._tell(job)
        self.waiting = []
        await self._notify()
        return len(queued)

    def interrupt(self, why: str) -> int:
        """Stop now (a second signal): kill every worker, record the jobs they ran or
        would have run as interrupted and remove their files; returns how many."""
        self.ready = False
        for task in self.tasks:
            task.cancel()
        for worker in self.workers:
            worker.kill()
        return self._interrupted(why)

    def _interrupted(self, why: str) -> int:
        left = list(self.live.values())
        for job in left:
            job.state, job.status, job.finished = "interrupted", 503, time.time()
            job.error = f"{why}; submit it again"
            remove(job.audio, job.video, job.audio and job.audio + ".part")
            job.audio = job.video = None
            self.metrics.renders.labels("interrupted").inc()
            self.live.pop(job.id, None)
            self.records.save(job)
            self._tell(job)
        sweep_orphans(self.retention.data)  # uploads still arriving, partial videos
        return len(left)

    # -- submitting and cancelling ----------------------------------------------------

    def admit(self, kind: str, client: str, body_bytes: int | None = None) -> Ticket:
        """A place for a request of `kind` from `client` whose body is `body_bytes` long
        (its Content-Length, when it has one), or Busy (503 with Retry-After): the server
        drains, the queue holds `size` jobs, or a worker is not expected to start it
        within max_wait. Retry-After is when a worker is expected to be free for it."""
        if self.draining_until is not None:
            left = self.draining_until - time.monotonic()
            raise Busy(
                "draining",
                left,
                f"the server is shutting down (a restart or deploy); retry in {max(1, int(left))} s",
            )
        priority = priority_of(kind)
        if priority == "background":
            if self.room(kind) <= 0:
                # a place frees when the first queued precompile starts: when a worker is
                # free of the renders (none of the queued precompiles ahead of it)
                raise Busy(
                    "queue_full",
                    self.expected_start("render", client),
                    f"the precompile queue is full ({self.background_size} avatars queued, "
                    "--max-queued-precompiles); retry later",
                )
        elif self.room(kind) <= 0:  # cancelled ones hold no place
            start = self.expected_start(kind, client)
            raise Busy(
                "queue_full",
                start,
                f"the render queue is full ({self.size} jobs waiting); retry later",
            )
        if self.max_wait is not None and priority == "editor":
            start = self.expected_start(kind, client)
            if start > self.max_wait:
                raise Busy(
                    "busy",
                    start,
                    f"the server is busy: a worker would start this in about {start:.1f} s, "
                    f"over the {self.max_wait:g} s it may wait (--max-wait); "
                    f"retry in {whole_seconds(start)} s",
                )
        audio = self.times.audio_of_upload(client, body_bytes)
        seconds = self.times.estimate(kind, self.renderer, audio)
        ticket = Ticket(kind, client, seconds, self._release, body_bytes)
        self.tickets.append(ticket)
        self.metrics.admitted.labels(kind).inc()
        return ticket

    def room(self, kind: str) -> int:
        """Places left in the queue of `kind`'s priority: --queue-size for an editor's
        work, --max-queued-precompiles for background work (none while draining)."""
        if self.draining_until is not None:
            return 0
        priority = priority_of(kind)
        held = self.depth(priority) + sum(priority_of(t.kind) == priority for t in self.tickets)
        return (self.background_size if priority == "background" else self.size) - held

    def expected_start(self, kind: str, client: str) -> float:
        """Seconds until a worker would start a new job of `kind` from `client`."""
        now, editor = self.clock(), priority_of(kind) == "editor"
        running = [
            Slot(self._remaining(job, now), job.owner or "")
            for job in (self.live.get(jid) for jid in self.running)
            if job is not None
        ]
        ahead = [
            Slot(self._estimate(job), job.owner or "")
            for job, _, _ in self.waiting
            if job.state == "queued" and (not editor or priority_of(job.kind) == "editor")
        ]
        ahead += [
            Slot(t.seconds, t.client)
            for t in self.tickets
            if not editor or priority_of(t.kind) == "editor"
        ]
        return expected_start(running, ahead, client, self.n_workers, self.cap)

    def _remaining(self, job: Job, now: float) -> float:
        """Seconds a running job will still take: from its progress once it has some (a
        job past its estimate is not about to end), else its estimate less what passed,
        and once past that with no progress, as long again as it has run."""
        elapsed, part = now - (job.started or now), job.fraction()
        if part > 0.05:
            return elapsed * (1 - part) / part
        estimate = self._estimate(job)
        if elapsed < estimate:
            return estimate - elapsed
        # past its estimate with no progress to go by: the estimate was wrong by a factor
        # nobody knows, so take it as halfway (as long again as it has run), never "now"
        return elapsed

    def _estimate(self, job: Job) -> float:
        size = self.times.size_of(job.persona, job.attire, job.motion)
        return self.times.estimate(job.kind, job.backend, job.audio_seconds, size)

    def _release(self, ticket: Ticket) -> None:
        if ticket in self.tickets:
            self.tickets.remove(ticket)

    def submit(self, job: Job, request_fields: dict, recipe: Any) -> Job:
        """Queue the job in its admitted request's place (admission.TICKET); a job with
        no ticket is admitted here, or refused with Problem 503 and Retry-After."""
        ticket = TICKET.get()
        if ticket is None or ticket.used:
            try:
                ticket = self.admit(job.kind, job.owner or "")
            except Busy as busy:
                self.metrics.refused.labels(job.kind, busy.reason).inc()
                raise Problem(503, busy.detail, busy.headers) from None
        ticket.done()
        self.times.learn_upload(ticket.client, ticket.body_bytes, job.audio_seconds)
        self.waiting.append((job, request_fields, recipe))
        self.live[job.id] = job
        self.records.save(job)
        self.work.set()
        return job

    def request_ended(self) -> None:
        """An admitted request's answer ended (admission.py): wakes a drain waiting on it."""
        self.in_flight -= 1
        task = asyncio.get_running_loop().create_task(self._notify())
        self._pending.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._pending.discard)

    def depth(self, priority: str | None = None) -> int:
        """Jobs waiting for a worker (of one priority: "editor" or "background")."""
        return sum(
            job.state == "queued" and priority in (None, priority_of(job.kind))
            for job, _, _ in self.waiting
        )

    def place(self, job: Job) -> int | None:
        """A queued job's place in the order workers take jobs (1: next), or None."""
        if job.state != "queued":
            return None
        order = [
            j
            for p in ("editor", "background")
            for j, _, _ in self.waiting
            if j.state == "queued" and priority_of(j.kind) == p
        ]
        return order.index(job) + 1 if job in order else None

    def background(self) -> list[Job]:
        """The background queue: precompiles running, then those waiting, in order."""
        running = [j for j in self.live.values() if j.state == "running" and j.kind == "precompile"]
        waiting = [j for j, _, _ in self.waiting if j.state == "queued" and j.kind == "precompile"]
        return running + waiting

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
        await self.finish(job, "cancelled", error=reason, status=499)
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
            job, request_fields, recipe = await self._take(worker)
            self.metrics.queue_wait.labels(job.kind).observe(job.started - job.created)
            self.records.save(job)
            await self._notify()
            process = worker.process
            message = (job.id, job.kind, request_fields, recipe)
            try:
                for last in (False, True):
                    # a worker that dies before it says it took the job (the send fails,
                    # or its pipe ends before "taken") had died idle, or as the job
                    # reached it: nothing of the job ran, so a fresh worker takes it, once
                    try:
                        await loop.run_in_executor(self.threads, worker.send, message)
                        if await self._follow(job, worker, last, recipe) or last:
                            break
                    except (OSError, EOFError, ValueError):
                        if last:
                            raise
                    print(
                        f"hotplate serve: render worker gone before job {job.id} started; "
                        "sending it to a fresh one",
                        flush=True,
                    )
                    await loop.run_in_executor(self.threads, worker.kill, process)
                    await self._restart(worker)
                    process = worker.process
            except (OSError, EOFError, ValueError) as exc:  # the pipe broke: the worker died
                if job.state == "running":
                    await self.finish(
                        job, "failed", error=f"the render worker died ({exc})", status=500
                    )
            finally:
                self.running.pop(job.id, None)
                self.work.set()  # a client under its cap again may have work waiting
            # A cancel kills this job's worker; _follow can return (cancelled) before the
            # kill lands, so make sure of it here, on the process that ran the job.
            if job.state == "cancelled" or not process.is_alive():
                await loop.run_in_executor(self.threads, worker.kill, process)
                await self._restart(worker)

    async def _take(self, worker: RenderWorker) -> Entry:
        """The next job for `worker`, once there is one it may take (module doc); while it
        waits, a worker process that dies is replaced (IDLE_CHECK)."""
        while True:
            if not worker.process.is_alive():
                print(
                    f"hotplate serve: render worker died while idle (exit code "
                    f"{worker.exitcode()}); starting another",
                    flush=True,
                )
                await asyncio.get_running_loop().run_in_executor(self.threads, worker.kill)
                await self._restart(worker)
            entry = self.dispatch(worker)
            if entry is not None:
                return entry
            self.work.clear()
            try:
                await asyncio.wait_for(self.work.wait(), IDLE_CHECK)
            except TimeoutError:
                pass

    def dispatch(self, worker: Any) -> Entry | None:
        """The job `worker` takes now (module doc), marked running, or None."""
        entry = self._pick()
        if entry is not None:
            job = entry[0]
            self.running[job.id] = worker  # before any await: the cap counts it
            job.state, job.started = "running", self.clock()
        return entry

    def _pick(self) -> Entry | None:
        if self.draining_until is not None:  # a drain starts nothing more (begin_drain)
            return None
        self.waiting = [e for e in self.waiting if e[0].state == "queued"]  # drop cancelled
        held = Counter(job.owner for job in (self.live.get(j) for j in self.running) if job)
        for priority in ("editor", "background"):
            for i, (job, _, _) in enumerate(self.waiting):
                if priority_of(job.kind) == priority and held[job.owner] < self.cap:
                    return self.waiting.pop(i)
        return None

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

    async def _follow(
        self, job: Job, worker: RenderWorker, last: bool = True, recipe: Any = None
    ) -> bool:
        """The worker's messages about `job` until it ends. False (the job left running)
        when the worker died before it said "taken" and this is not the `last` try.
        `recipe`: the job's, to find the precompiles its JIT build makes (module doc)."""
        loop = asyncio.get_running_loop()
        heard = False
        while True:
            msg = await loop.run_in_executor(self.threads, worker.recv)
            if job.state == "cancelled":
                return True
            if msg is None and not heard and not last:
                return False
            if msg is not None and msg[0] == "taken":
                heard = True
                continue
            if msg is None:
                code = await loop.run_in_executor(self.threads, worker.exitcode)
                await self.finish(
                    job, "failed", error=f"the render worker died (exit code {code})", status=500
                )
                return True
            if msg[0] == "jit":
                job.jit = True
                self._take_riders(job, recipe)
                await self._notify()
            elif msg[0] == "progress":
                job.step, job.done, job.total = msg[2], msg[3], msg[4]
                if msg[2] == "render" and job.jit is None:  # rendering with no "jit" first
                    job.jit = False
                await self._notify()
            elif msg[0] == "ok":
                await self.finish(job, "done", result=msg[2])
                return True
            else:
                await self.finish(job, "failed", error=msg[3], status=msg[2])
                return True

    def _take_riders(self, job: Job, recipe: Any) -> None:
        """The queued precompiles of the avatar `job` is building now (module doc)."""
        if job.kind == "precompile":
            return
        same = (job.persona, job.attire, job.motion, job.backend, recipe)
        riders = [
            e
            for e in self.waiting
            if e[0].kind == "precompile"
            and e[0].state == "queued"
            and "source" not in e[1]  # the watcher's file: its digest, its bank, its checks
            and (e[0].persona, e[0].attire, e[0].motion, e[0].backend, e[2]) == same
        ]
        for entry in riders:
            self.waiting.remove(entry)
            rider = entry[0]
            rider.state, rider.started = "running", self.clock()
            rider.step = f"built by render job {job.id}"
            self.records.save(rider)
        if riders:
            self.riders[job.id] = riders

    async def _end_riders(self, job: Job) -> None:
        """`job` ended: its riders are done with its avatar, or queued again at the head."""
        riders = [e for e in self.riders.pop(job.id, []) if e[0].state == "running"]
        if job.state == "done":
            result = {"avatar": job.avatar, "jit": True, "jit_seconds": job.jit_seconds}
            for rider, _, _ in riders:
                await self.finish(rider, "done", result=result, measure=False)
            return
        for rider, _, _ in riders:
            rider.state, rider.started, rider.step = "queued", None, ""
            self.records.save(rider)
        self.waiting[:0] = riders
        self.work.set()

    async def finish(
        self,
        job: Job,
        state: str,
        result: dict | None = None,
        error: str | None = None,
        status: int | None = None,
        measure: bool = True,
    ) -> None:
        """A job's end (its worker's answer, its death, a cancel): recorded, measured
        (not with `measure` False: a rider's time is its render's), its files kept or
        removed; its worker counts as free from here."""
        job.state, job.finished, job.error, job.status = state, self.clock(), error, status
        self.running.pop(job.id, None)
        result = dict(result or {})
        size = result.pop("size", None)  # the avatar's WxH: for the estimate, not the record
        for key, value in result.items():
            if hasattr(job, key):
                setattr(job, key, value)
        job.total_seconds = job.finished - job.created
        remove(job.audio)
        job.audio = None
        if state != "done":
            remove(job.video)
            job.video = None
        elif measure:
            self._measure(job, size)
        self.metrics.renders.labels(state).inc()
        self.live.pop(job.id, None)
        self.records.save(job)
        self._tell(job, result)
        await self._end_riders(job)
        if state == "done" and self.retention.max_bytes is not None:
            await asyncio.to_thread(self._retain, None)
        await self._notify()

    def _tell(self, job: Job, result: dict | None = None) -> None:
        """Call the job's on_end, if it has one (it must not raise)."""
        told = self.on_end.pop(job.id, None)
        if told is not None:
            told(job, result or {})

    def _measure(self, job: Job, size: str | None = None) -> None:
        """A finished job's figures: its service time (for admission) and the histograms."""
        m = self.metrics
        service = job.finished - (job.started or job.created)
        m.render_seconds.observe(job.total_seconds)
        jit = job.jit_seconds if job.jit and job.jit_seconds else 0.0
        if job.jit:
            m.jit.inc()
            m.jit_seconds.observe(jit)
        rendering = max(service - jit, 0.0)
        first = job.first_frame_seconds - jit if job.first_frame_seconds is not None else None
        names = (job.persona, job.attire, default_motion(job.motion))
        self.times.record(job.kind, job.backend, rendering, job.audio_seconds, first, size, names)
        if job.kind not in ("precompile", "talk") and job.audio_seconds and rendering > 0:
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
