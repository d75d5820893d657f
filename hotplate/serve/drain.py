"""`hotplate serve` under uvicorn, with a drain for deploys.

- The first SIGTERM drains: the server admits nothing more (503 with Retry-After, a live
  session 1013; admission.py) and `/readyz` answers 503, while the listening socket
  stays open so probes and clients get those answers. Conversation sessions are ended
  at once (a conversation never finishes by itself). The jobs queued and running and
  the answers still being sent (a stream's last fragments, a blocking render's MP4)
  finish, for up to `--drain-timeout`; then uvicorn's own graceful shutdown closes the
  connections and the app's lifespan stops the workers. Exit status 0.
- A second SIGTERM, or SIGINT (Ctrl-C) at any time, stops at once: the workers are
  killed, their jobs recorded as `interrupted` and their partial files removed. Exit
  status 128 + the signal's number, as a shell reports a process a signal ended.

uvicorn's own handler is replaced (`handle_exit`): it would close the socket at the first
signal, and re-raise the signal after shutdown, which ends the process with that signal
instead of a status.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import uvicorn

log = logging.getLogger("hotplate.serve")
SHUTDOWN_GRACE_S = 5.0  # after the drain: connections still open get this long to end


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose signals drain, then stop (module doc)."""

    def __init__(self, config: uvicorn.Config, app: Any, drain_timeout: float) -> None:
        super().__init__(config)
        self.app, self.drain_timeout = app, drain_timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self.draining: asyncio.Task | None = None
        self.interrupted_by: int | None = None

    async def startup(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        """Runs in the main thread between the loop's callbacks: only schedules."""
        service = getattr(self.app.state, "service", None)
        if self.loop is None or service is None:  # not started yet: nothing to drain
            self.should_exit = True
            return
        if sig == signal.SIGTERM and self.draining is None and not self.should_exit:
            self.loop.call_soon_threadsafe(self._start_drain, service)
        elif self.interrupted_by is None:
            self.interrupted_by = sig
            self.loop.call_soon_threadsafe(self._interrupt, service, sig)

    def _start_drain(self, service: Any) -> None:
        self.draining = asyncio.ensure_future(self._drain(service))

    async def _drain(self, service: Any) -> None:
        queue = service.queue
        await service.stop_watching()  # first: the watcher queues nothing more
        queued = await queue.begin_drain(self.drain_timeout)
        log.info(
            "SIGTERM: draining (%d job(s) running; %d queued answered 503), up to %g s; "
            "a second SIGTERM or Ctrl-C stops at once",
            len(queue.live),
            queued,
            self.drain_timeout,
        )
        await service.sessions.end_all("the server is shutting down")
        if not await queue.drained(self.drain_timeout):
            log.warning(
                "drain timeout: %d job(s) not finished are recorded as interrupted",
                len(queue.live),
            )
        self.config.timeout_graceful_shutdown = SHUTDOWN_GRACE_S
        self.should_exit = True

    def _interrupt(self, service: Any, sig: int) -> None:
        n = service.queue.interrupt(f"the server was stopped ({signal.Signals(sig).name})")
        log.warning(
            "%s: stopping now; %d job(s) recorded as interrupted", signal.Signals(sig).name, n
        )
        self.force_exit = self.should_exit = True


def run(app: Any, host: str, port: int, drain_timeout: float) -> int:
    """Serve `app` until a signal ends it; returns the exit status (module doc)."""
    from hotplate.serve.limits import MAX_PCM_MESSAGE
    from hotplate.serve.ws_protocol import protocol

    # every WebSocket message is bounded by the largest kind a route takes (limits.py):
    # uvicorn closes a bigger one with 1009 before the app sees it
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        access_log=False,
        ws_max_size=MAX_PCM_MESSAGE,
        ws=protocol(),
    )
    server = DrainingServer(config, app, drain_timeout)
    server.run()
    return 0 if server.interrupted_by is None else 128 + server.interrupted_by
