"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from hotplate.serve.deps import Config, Svc
from hotplate.serve.metrics import MEDIA_TYPE

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(config: Config) -> dict:
    """The process answers. `token_required` tells the page to ask for one."""
    return {"status": "ok", "token_required": config.token_required}


@router.get("/readyz")
def readyz(svc: Svc) -> JSONResponse:
    """Ready when every render worker has started and the store opens."""
    ready = svc.queue.ready and all(w.process.is_alive() for w in svc.queue.workers)
    body = {
        "ready": ready,
        "workers": len(svc.queue.workers),
        "worker_pids": [w.process.pid for w in svc.queue.workers],
        "queued": svc.queue.queue.qsize(),
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response)
def metrics(svc: Svc) -> Response:
    """Prometheus text format (see hotplate/serve/metrics.py for the families)."""
    return Response(svc.metrics.render(), media_type=MEDIA_TYPE)
