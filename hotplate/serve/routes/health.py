"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from hotplate.serve.deps import Config, Svc
from hotplate.serve.metrics import render_metrics

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(config: Config) -> dict:
    """The process answers. `token_required` tells the page to ask for one."""
    return {"status": "ok", "token_required": config.token_required}


@router.get("/readyz")
def readyz(svc: Svc) -> JSONResponse:
    """Ready when every render worker has started and the store opens. Open to anyone
    (a probe sends no token), so it says how many, never which processes."""
    ready = svc.queue.ready and all(w.process.is_alive() for w in svc.queue.workers)
    body = {"ready": ready, "workers": len(svc.queue.workers), "queued": svc.queue.queue.qsize()}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response)
def metrics(svc: Svc) -> Response:
    return Response(
        render_metrics(svc.queue, svc.store),
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )
