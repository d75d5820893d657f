"""`/readyz` under `hotplate serve --ray`: ready means whole.

A job lives on one replica and the others reach it through the peer book (peers.py); a
signed URL opens on the replica that owns its job, whichever replica signed it. So one
replica's own readiness (its workers up, not draining) says nothing about the next
request, which Serve may send to any replica. A replica's `/readyz` answers 200 only
when the deployment is whole:

- its own service is ready (routes/health.py: `service_readiness`);
- Serve's controller has at least the deployment's replicas (`--replicas`, the
  autoscaler's minimum) RUNNING, so the proxy can send requests to every one;
- the peer book lists at least that many replicas, this one included, and at least as
  many as are RUNNING, whose listeners answer the peer probe (`PROBE_PATH`, behind the
  peer gate: only a replica holding this deployment's signing key gets past it) with this
  replica's key id, their own tag, and a ready service. Each of them can then answer any
  job (the book knows its owner) and any signature (one key).

A replica registers in the book before its start finishes (replica_app's lifespan), so
Serve never routes to a replica the others cannot find. While a dead replica is being
replaced, `/readyz` says 503 on the survivors (they still answer what they can);
`/healthz` is the liveness probe. The body says how many, never which: `replicas`
(wanted), `replicas_running` (Serve's count) and `replicas_whole` (those that agree).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

from hotplate.cluster.peers import PEER_HEADER, PROBE_PATH

PROBE_TIMEOUT = 3.0  # seconds for one peer's answer; a slower one counts as not ready
# seconds for Serve's controller and the peer book together: a slow or stopped controller
# makes /readyz a 503 in this long, not a hang (a balancer's probe has its own timeout)
CONTROLLER_TIMEOUT = 3.0
log = logging.getLogger("hotplate.serve")


def key_id(signing_key: str) -> str:
    """What replicas compare to know they hold one signing key (it reveals nothing of it)."""
    return hmac.new(signing_key.encode(), b"hotplate key id", hashlib.sha256).hexdigest()[:16]


def running_replicas(app_name: str, deployment: str) -> int:
    """How many of the deployment's replicas Serve's controller has RUNNING (blocking)."""
    from ray import serve

    application = serve.status().applications.get(app_name)
    overview = application.deployments.get(deployment) if application else None
    return int(overview.replica_states.get("RUNNING", 0)) if overview else 0


class Readiness:
    """One replica's view of the deployment: the probe it answers and the check its
    `/readyz` runs (module doc). `url` is set once its peer listener is up."""

    def __init__(
        self,
        tag: str,
        signing_key: str,
        secret: bytes,
        book: Any,
        wanted: int,
        local: Callable[[], bool],
        app_name: str,
        deployment: str,
    ) -> None:
        self.tag, self.key, self.secret, self.book = tag, key_id(signing_key), secret, book
        self.wanted, self.local = wanted, local
        self.app_name, self.deployment = app_name, deployment
        self.url: str | None = None
        self.client: Any = None
        # the controller's answer still awaited, if any: serve.status() in a thread cannot
        # be cancelled, so a slow controller gets one such call at a time, not one per probe
        self.status_call: asyncio.Future | None = None

    def probe_answer(self) -> dict:
        """What this replica tells a peer that asks (through the peer gate)."""
        return {"tag": self.tag, "key": self.key, "ready": self.local()}

    async def __call__(self) -> dict:
        """The whole check: {"ready", "replicas", "replicas_running", "replicas_whole"}."""
        if self.status_call is None or self.status_call.done():
            self.status_call = asyncio.ensure_future(
                asyncio.to_thread(running_replicas, self.app_name, self.deployment)
            )
        try:
            running, peers = await asyncio.wait_for(
                asyncio.gather(asyncio.shield(self.status_call), self.book.all.remote()),
                CONTROLLER_TIMEOUT,
            )
        except TimeoutError:
            log.info(
                "readiness: Serve's controller or the peer book did not answer in %g s",
                CONTROLLER_TIMEOUT,
            )
            running, peers = 0, {}
        except Exception as exc:  # noqa: BLE001 - the controller or the book is away
            log.info("readiness: Serve's controller or the peer book did not answer (%s)", exc)
            running, peers = 0, {}
        others = [(tag, url) for tag, url in peers.items() if tag != self.tag]
        answers = await asyncio.gather(*(self._agrees(tag, url) for tag, url in others))
        whole = (peers.get(self.tag) == self.url and self.url is not None) + sum(answers)
        ready = running >= self.wanted and whole >= max(self.wanted, running)
        return {
            "ready": ready,
            "replicas": self.wanted,
            "replicas_running": running,
            "replicas_whole": whole,
        }

    async def _agrees(self, tag: str, url: str) -> bool:
        """Whether the replica the book lists as `tag` at `url` answers, with this key, as
        `tag`, ready. A listener that is gone (a dead replica's, or a past deployment's
        left in the detached book) or holds another key does not."""
        import httpx

        if self.client is None:  # made on the replica's loop, used only there
            self.client = httpx.AsyncClient(timeout=PROBE_TIMEOUT)
        try:
            answer = await self.client.get(url + PROBE_PATH, headers={PEER_HEADER: self.secret})
            found = answer.json() if answer.status_code == 200 else {}
        except (httpx.HTTPError, ValueError) as exc:
            log.info("readiness: replica %s at %s did not answer the probe (%s)", tag, url, exc)
            return False
        return (
            found.get("tag") == tag and found.get("key") == self.key and found.get("ready") is True
        )
