"""Admission: a request for work is taken only if a worker is expected to start it within
`--max-wait`; otherwise it is refused at once, before any of its body is read, with a
503 and `Retry-After` (a live session: close code 1013 right after the handshake).

- `ServiceTimes` is the cost model: per renderer and avatar size, a render's (or a
  stream's) seconds on a worker as `overhead + rate x seconds of audio` (`Cost`), seeded
  at start by each worker's warm-up render of every avatar size the store holds hot
  (workers.warm_up_renders), then updated from every finished job; per kind, the seconds
  of a whole job whose length is not known (a precompile, a live session).
- A request's own size: before its body is read, its audio's length is estimated from its
  Content-Length and the bytes per second of audio its client's uploads have had (a
  16 kHz mono 16-bit WAV's until one is decoded); once the route has decoded the audio,
  its job is estimated from the decoded length, its renderer and its avatar's size.
- `expected_start` plays the queue forward: the running jobs' remaining estimates, then
  the jobs ahead (an editor's request is behind other editors' work, ahead of queued
  precompiles), dispatched as the queue dispatches them (first come first served within
  a priority, a client holding `cap` workers waits), until a worker would take the new one.
  A refusal's `Retry-After` is that start: when the work now ahead of it has drained, and
  a request sent then is served at once.
- `Admission` is the ASGI middleware (inside the guard, so the caller is known) that asks
  the queue for a `Ticket` before the route runs. The ticket holds the request's place in
  the estimate while its upload is read, so a burst arriving at once is admitted only as
  far as it fits; the route's `queue.submit` turns it into the job (`TICKET`), and a
  request that ends without a job gives its place back.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hotplate.serve.guard import linger
from hotplate.serve.problems import problem_body

log = logging.getLogger("hotplate.serve")

# Before the first measurement of its kind (a warm-up render seeds the renderer's cost;
# the first job on an idle worker needs no estimate):
PRIOR_RATE = 1.0  # seconds of work per second of audio
PRIOR_SECONDS = {
    "render": 10.0,
    "stream": 10.0,
    "live": 30.0,
    "precompile": 30.0,
    "talk": 300.0,  # a conversation session: it holds its worker until it ends
}
# Upload bytes per second of audio before a client's first upload is decoded: a 16 kHz
# mono 16-bit WAV (what `hotplate demo` and the tests write); a 48 kHz stereo WAV is
# 6x that (its first estimate is long: refused early, never admitted past max_wait),
# an MP3 at 128 kb/s half (its first estimate is short, until one has been decoded).
PRIOR_BYTES_PER_SECOND = 32000.0
FORM_BYTES = 1024  # the multipart boundaries and small fields around a request's audio
SMOOTHING = 0.3  # weight of the newest measurement (an exponential moving average)
AUDIO_KINDS = ("render", "stream")  # jobs whose cost follows their audio's length
SHORT_CLIP = 1.0  # s of audio: a render shorter than this updates a cost's overhead only

# The routes that queue work, and the kind of job each makes.
WORK_ROUTES = {
    ("POST", "/v1/lip-sync"): "render",
    ("POST", "/v1/renders"): "render",
    ("POST", "/v1/lip-sync/stream"): "stream",
    ("POST", "/v1/precompile"): "precompile",
    ("WEBSOCKET", "/v1/live"): "live",
    ("POST", "/v1/sessions"): "talk",
}
TRY_AGAIN_LATER = 1013  # WebSocket close code (RFC 6455 registry)

TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("ticket", default=None)


def priority_of(kind: str) -> str:
    """An editor's render, stream or live session goes before a background precompile."""
    return "background" if kind == "precompile" else "editor"


@dataclass(frozen=True)
class Cost:
    """A render's seconds on a worker: `overhead` (resolve, lease, load the avatar, decode
    the audio: until the first frame) plus `rate` seconds per second of audio."""

    overhead: float
    rate: float

    def seconds(self, audio_seconds: float) -> float:
        return self.overhead + self.rate * audio_seconds

    def updated(self, new: Cost) -> Cost:
        return Cost(_average(self.overhead, new.overhead), _average(self.rate, new.rate))

    @classmethod
    def measured(cls, seconds: float, audio_seconds: float, first_frame: float | None) -> Cost:
        """One render's cost: `first_frame` (JIT excluded) is its overhead, the rest its
        rate; without it, all of it is rate."""
        overhead = min(max(first_frame or 0.0, 0.0), seconds)
        return cls(overhead, (seconds - overhead) / audio_seconds)


PRIOR_COST = Cost(0.0, PRIOR_RATE)


def default_motion(motion: str | None) -> str:
    return motion or "default"  # pipeline.personas.DEFAULT, without importing the pipeline


class ServiceTimes:
    """The cost model (module doc): moving averages of what the workers measured."""

    def __init__(self) -> None:
        # (renderer, "WxH") -> Cost, and (renderer, None) -> Cost over every size: what a
        # request whose avatar is not known yet (its form not read) is estimated with
        self.costs: dict[tuple[str, str | None], Cost] = {}
        self.sizes: dict[tuple[str, str, str], str] = {}  # (persona, attire, motion) -> WxH
        self.whole: dict[str, float] = {}  # kind -> seconds per job
        self.upload: dict[str, float] = {}  # client ("" for any) -> bytes per audio second

    def seed(self, backend: str, size: str, cost: Cost, names: tuple | None = None) -> None:
        """A warm-up render's cost: the renderer's, for this size and for any size until
        a job is measured (the costliest size's: a request of unknown size is not
        admitted past max_wait on a cheaper one's figure)."""
        self.costs[(backend, size)] = cost
        known = self.costs.get((backend, None))
        if known is None or cost.seconds(1.0) > known.seconds(1.0):
            self.costs[(backend, None)] = cost
        if names is not None:
            self.sizes[names] = size

    def record(
        self,
        kind: str,
        backend: str,
        seconds: float,
        audio_seconds: float | None,
        first_frame: float | None = None,
        size: str | None = None,
        names: tuple | None = None,
    ) -> None:
        """One finished job: `seconds` on its worker and `first_frame` of them before its
        first frame (JIT excluded from both), its audio's length, its avatar's size."""
        self.whole[kind] = _average(self.whole.get(kind), seconds)
        if kind not in AUDIO_KINDS or not audio_seconds:
            return
        for key in {(backend, size), (backend, None)}:
            old = self.costs.get(key)
            if old is not None and audio_seconds < SHORT_CLIP:
                # mostly overhead (and the encoder's flush after the last frame, which a
                # rate from it would multiply): it moves the overhead only
                new = Cost(max(seconds - old.rate * audio_seconds, 0.0), old.rate)
            else:
                new = Cost.measured(seconds, audio_seconds, first_frame)
            self.costs[key] = new if old is None else old.updated(new)
        if size is not None and names is not None:
            self.sizes[names] = size

    def cost(self, backend: str, size: str | None = None) -> Cost:
        """The renderer's cost for this size, else over every size, else the prior."""
        return self.costs.get((backend, size)) or self.costs.get((backend, None)) or PRIOR_COST

    def size_of(self, persona: str, attire: str, motion: str | None) -> str | None:
        return self.sizes.get((persona, attire, default_motion(motion)))

    def estimate(
        self,
        kind: str,
        backend: str = "",
        audio_seconds: float | None = None,
        size: str | None = None,
    ) -> float:
        """Seconds a job will hold a worker: from its audio when that is known."""
        if kind in AUDIO_KINDS and audio_seconds is not None:
            return self.cost(backend, size).seconds(audio_seconds)
        return self.whole.get(kind, PRIOR_SECONDS.get(kind, PRIOR_SECONDS["render"]))

    def audio_of_upload(self, client: str, body_bytes: int | None) -> float | None:
        """Seconds of audio a request of `body_bytes` (its Content-Length) likely carries:
        by its client's uploads so far, else anyone's, else the prior's."""
        if not body_bytes:
            return None
        per_s = self.upload.get(client) or self.upload.get("") or PRIOR_BYTES_PER_SECOND
        return max(body_bytes - FORM_BYTES, 0) / per_s

    def learn_upload(self, client: str, body_bytes: int | None, audio_seconds: float | None):
        """A decoded upload: its bytes per second of audio, for the client's next ones."""
        if not body_bytes or not audio_seconds or body_bytes <= FORM_BYTES:
            return
        per_s = (body_bytes - FORM_BYTES) / audio_seconds
        for key in (client, ""):
            self.upload[key] = _average(self.upload.get(key), per_s)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


@dataclass
class Slot:
    """One job in the estimate: seconds it will still hold a worker, and whose it is."""

    seconds: float
    client: str


def expected_start(
    running: list[Slot], ahead: list[Slot], client: str, workers: int, cap: int
) -> float:
    """Seconds until a new job of `client`, queued behind `ahead`, would start: the queue
    played forward with its own rule (the first job in order whose client holds fewer
    than `cap` workers takes a free one)."""
    busy = [(s.seconds, s.client) for s in running]
    waiting = [*((s.seconds, s.client) for s in ahead), (None, client)]
    now = 0.0
    while True:
        held = Counter(c for _, c in busy)
        i = 0
        while len(busy) < workers and i < len(waiting):
            seconds, who = waiting[i]
            if held[who] >= cap:
                i += 1
                continue
            if seconds is None:
                return now
            busy.append((now + seconds, who))
            held[who] += 1
            waiting.pop(i)
        if not busy:  # nothing runs and nothing may start: cannot happen with cap >= 1
            return now
        busy.sort()
        now = busy.pop(0)[0]


RETRY_SPREAD = 0.5  # refused clients come back spread over [wait, wait x 1.5] (at least 1 s)


def spread_retry(wait: float, draw: Callable[[], float] = random.random) -> float:
    """When to tell a refused client to come back: never before the estimate, but spread
    past it, so a burst refused together does not return at one instant and meet the same
    refusal again (a thundering herd)."""
    return wait + max(1.0, RETRY_SPREAD * wait) * draw()


def whole_seconds(seconds: float) -> int:
    """A wait as Retry-After gives it: whole seconds, the nearest, at least 1."""
    return max(1, math.floor(seconds + 0.5))


class Busy(Exception):
    """A request refused now: why (busy, queue_full, draining) and when to come back:
    `wait` as estimated, `retry_after` as the header says it: the wait spread past the
    estimate (`spread_retry`), in whole seconds (`whole_seconds`)."""

    def __init__(self, reason: str, retry_after: float, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.wait = reason, detail, max(0.0, retry_after)
        self.retry_after = whole_seconds(spread_retry(self.wait))

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


@dataclass(eq=False)
class Ticket:
    """An admitted request's place in the estimate until its job is queued (or it ends):
    its estimate, and its Content-Length (to learn its client's bytes per audio second)."""

    kind: str
    client: str
    seconds: float
    release: Callable[[Ticket], None]
    body_bytes: int | None = None
    used: bool = False

    def done(self) -> None:
        """The request ended: give the place back if no job took it."""
        if not self.used:
            self.used = True
            self.release(self)


def content_length(scope: dict) -> int | None:
    """The request's Content-Length header (None when absent, chunked or not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class Admission:
    """The ASGI middleware (module doc). Other routes pass through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        method = "WEBSOCKET" if scope["type"] == "websocket" else scope.get("method", "")
        kind = WORK_ROUTES.get((method, scope.get("path", "")))
        service = getattr(scope["app"].state, "service", None) if kind else None
        if service is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("state", {}).get("client")
        try:
            if kind == "talk":  # the session caps first: they say what is full
                service.sessions.admit(getattr(client, "id", "local"))
            ticket = service.queue.admit(
                kind, getattr(client, "id", "local"), content_length(scope)
            )
        except Busy as busy:
            service.metrics.refused.labels(kind, busy.reason).inc()
            request_id = scope.get("state", {}).get("request_id", "")
            log.info("request %s %s refused (%s): %s", request_id, kind, busy.reason, busy)
            if method == "WEBSOCKET":
                await refuse_socket(receive, send, busy)
            else:
                await refuse_http(scope, receive, send, busy, request_id)
            return
        # The ticket is given back the moment the request's answer starts (or the guard
        # cuts its body off), not when the app returns: FastAPI closes the uploads after
        # the answer is sent, and a client that reads a 507 or 422 and sends its next
        # request at once must not find this one still counted (its job, if it has one,
        # holds the place from queue.submit on).

        async def releasing_send(message: dict) -> None:
            if message["type"] in ("http.response.start", "websocket.close"):
                ticket.done()
            await send(message)

        async def releasing_receive() -> dict:
            try:
                return await receive()
            except BaseException:  # the guard answered (413) and cuts the body off
                ticket.done()
                raise

        token = TICKET.set(ticket)
        service.queue.in_flight += 1
        try:
            await self.app(scope, releasing_receive, releasing_send)
        finally:
            TICKET.reset(token)
            ticket.done()
            service.queue.request_ended()


async def refuse_http(scope: dict, receive: Any, send: Any, busy: Busy, request_id: str) -> None:
    """503 problem+json with Retry-After (and `retry_after_seconds`, the estimate before it
    was rounded to whole seconds), sent before the body is read; the connection
    closes after a bounded linger drops what the client still sends (guard.linger)."""
    problem = problem_body(503, busy.detail, scope.get("path", ""), request_id)
    problem["retry_after_seconds"] = round(busy.wait, 2)  # the estimate the header rounds
    body = json.dumps(problem).encode()
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(busy.retry_after).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await linger(receive)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def refuse_socket(receive: Any, send: Any, busy: Busy) -> None:
    """Accept, say why (with `retry_after`, which a close reason cannot carry as a
    number), close with 1013 (try again later); no message of the client is read."""
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    message = {"type": "error", "detail": busy.detail, "retry_after": busy.retry_after}
    await send({"type": "websocket.send", "text": json.dumps(message)})
    why = {"draining": "shutting down", "queue_full": "queue full"}.get(busy.reason, "busy")
    reason = f"{why}; retry in {busy.retry_after} s"
    await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": reason})
