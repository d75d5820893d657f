"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hotplate.serve.deps import Config, Svc
from hotplate.serve.metrics import MEDIA_TYPE

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(config: Config) -> dict:
    """The process answers. `token_required` tells the page to ask for one."""
    return {"status": "ok", "token_required": config.token_required}


def service_readiness(svc: Any) -> dict:
    """This server's own readiness: every render worker started and the store open, and
    not draining (after SIGTERM). Counts only: never which processes."""
    queue = svc.queue
    draining = queue.draining_until is not None
    ready = queue.ready and not draining and all(w.process.is_alive() for w in queue.workers)
    return {
        "ready": ready,
        "draining": draining,
        "workers": len(queue.workers),
        "queued": queue.depth(),
        "running": len(queue.running),
    }


@router.get("/readyz")
async def readyz(request: Request, svc: Svc) -> JSONResponse:
    """Ready when every render worker has started and the store opens; not ready while
    the server drains (after SIGTERM), so a load balancer sends new work elsewhere. A Ray
    replica is ready only when the whole deployment is (`app.state.whole`, set by
    hotplate/cluster/readiness.py): every replica up and answering every job and
    signature. Open to anyone (a probe sends no token), so it says how many, never which
    processes."""
    body = service_readiness(svc)
    whole = getattr(request.app.state, "whole", None)
    if whole is not None and body["ready"]:
        body.update(await whole())
    return JSONResponse(body, status_code=200 if body["ready"] else 503)


@router.get("/metrics", response_class=Response)
def metrics(svc: Svc) -> Response:
    """Prometheus text format (see hotplate/serve/metrics.py for the families)."""
    return Response(svc.metrics.render(), media_type=MEDIA_TYPE)
