"""Admission: a request for work is taken only if a worker is expected to start it within
`--max-wait`; otherwise it is refused at once, before any of its body is read, with a
503 and `Retry-After` (a live session: close code 1013 right after the handshake).

- `ServiceTimes` is what the queue has measured: per renderer, seconds of work per second
  of audio (renders and streams); per kind, the seconds of a whole job (a precompile, a
  live session, or a render whose audio has not been read yet).
- `expected_start` plays the queue forward: the running jobs' remaining estimates, then
  the jobs ahead (an editor's request is behind other editors' work, ahead of queued
  precompiles), dispatched as the queue dispatches them (first come first served within
  a priority, a client holding `cap` workers waits), until a worker would take the new one.
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hotplate.serve.guard import linger
from hotplate.serve.problems import problem_body

log = logging.getLogger("hotplate.serve")

# Before the first measurement of its kind (the first job on an idle worker needs none):
PRIOR_RATE = 1.0  # seconds of work per second of audio
PRIOR_SECONDS = {"render": 10.0, "stream": 10.0, "live": 30.0, "precompile": 30.0}
SMOOTHING = 0.3  # weight of the newest measurement (an exponential moving average)

# The routes that queue work, and the kind of job each makes.
WORK_ROUTES = {
    ("POST", "/v1/lip-sync"): "render",
    ("POST", "/v1/renders"): "render",
    ("POST", "/v1/lip-sync/stream"): "stream",
    ("POST", "/v1/precompile"): "precompile",
    ("WEBSOCKET", "/v1/live"): "live",
}
TRY_AGAIN_LATER = 1013  # WebSocket close code (RFC 6455 registry)

TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("ticket", default=None)


def priority_of(kind: str) -> str:
    """An editor's render, stream or live session goes before a background precompile."""
    return "background" if kind == "precompile" else "editor"


class ServiceTimes:
    """Service times the queue measured (module doc), as moving averages."""

    def __init__(self) -> None:
        self.rate: dict[str, float] = {}  # backend -> seconds of work per second of audio
        self.whole: dict[str, float] = {}  # kind -> seconds per job

    def record(self, kind: str, backend: str, seconds: float, audio_seconds: float | None):
        """One finished job: `seconds` on its worker (JIT excluded), its audio length."""
        self.whole[kind] = _average(self.whole.get(kind), seconds)
        if kind in ("render", "stream") and audio_seconds:
            self.rate[backend] = _average(self.rate.get(backend), seconds / audio_seconds)

    def estimate(self, kind: str, backend: str = "", audio_seconds: float | None = None):
        """Seconds a job will hold a worker: from its audio when that is known."""
        if kind in ("render", "stream") and audio_seconds:
            return self.rate.get(backend, PRIOR_RATE) * audio_seconds
        return self.whole.get(kind, PRIOR_SECONDS.get(kind, PRIOR_SECONDS["render"]))


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


class Busy(Exception):
    """A request refused now: why (busy, queue_full, draining) and when to come back."""

    def __init__(self, reason: str, retry_after: float, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail
        self.retry_after = max(1, math.ceil(retry_after))

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


@dataclass(eq=False)
class Ticket:
    """An admitted request's place in the estimate until its job is queued (or it ends)."""

    kind: str
    client: str
    seconds: float
    release: Callable[[Ticket], None]
    used: bool = False

    def done(self) -> None:
        """The request ended: give the place back if no job took it."""
        if not self.used:
            self.used = True
            self.release(self)


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
            ticket = service.queue.admit(kind, getattr(client, "id", "local"))
        except Busy as busy:
            service.metrics.refused.labels(kind, busy.reason).inc()
            request_id = scope.get("state", {}).get("request_id", "")
            log.info("request %s %s refused (%s): %s", request_id, kind, busy.reason, busy)
            if method == "WEBSOCKET":
                await refuse_socket(receive, send, busy)
            else:
                await refuse_http(scope, receive, send, busy, request_id)
            return
        token = TICKET.set(ticket)
        service.queue.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            TICKET.reset(token)
            ticket.done()
            service.queue.request_ended()


async def refuse_http(scope: dict, receive: Any, send: Any, busy: Busy, request_id: str) -> None:
    """503 problem+json with Retry-After, sent before the body is read; the connection
    closes after a bounded linger drops what the client still sends (guard.linger)."""
    body = json.dumps(problem_body(503, busy.detail, scope.get("path", ""), request_id)).encode()
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
