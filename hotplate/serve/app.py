"""The ASGI app: routes under /v1, the page at /, health, metrics.

Every request is checked (token, size, names, audio) in the server before it is queued,
so bad input costs no worker time; renders run in worker processes (jobs.py).
"""

import asyncio
import contextlib
import json
import secrets
import time
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from hotplate.serve import problems
from hotplate.serve.catalog import list_catalog, thumbnail
from hotplate.serve.jobs import FINISHED, Job, JobQueue, JobRecords, new_id, remove, snapshot
from hotplate.serve.metrics import render_metrics
from hotplate.serve.problems import Problem
from hotplate.serve.uploads import check_audio, save_upload
from hotplate.settings import Settings

STATIC = files("hotplate.serve") / "static"
FORM_OVERHEAD = 64 << 10  # multipart boundaries and the small fields


@dataclass
class ServeConfig:
    settings: Settings
    workers: int = 1
    queue_size: int = 16
    token: str | None = None
    max_upload_bytes: int = 50_000_000
    max_audio_seconds: float = 300.0
    retention_hours: float = 24.0
    data_dir: Path | None = None  # job records and outputs; default beside the store

    @property
    def data(self) -> Path:
        cache = self.settings.cache
        return self.data_dir or cache.with_name(cache.name + "-serve")


@dataclass
class RenderForm:
    persona: str
    audio: UploadFile
    attire: str
    motion: str | None
    backend: str | None


def render_form(
    persona: Annotated[str, Form(description="Persona folder name, e.g. ruby.")],
    audio: Annotated[UploadFile, File(description="WAV, MP3, M4A, FLAC or OGG.")],
    attire: Annotated[str, Form(description="Attire; the portrait when omitted.")] = "default",
    motion: Annotated[str | None, Form(description="Motion loop of the attire.")] = None,
    backend: Annotated[str | None, Form(description="warp or musetalk.")] = None,
) -> RenderForm:
    """The multipart fields of a render request (both render routes)."""
    return RenderForm(persona, audio, attire, motion, backend)


class Service:
    """What the routes share: config, the store handle, job records and the queue."""

    def __init__(self, config: ServeConfig) -> None:
        from cachestore.store import open_store

        self.config, s = config, config.settings
        for sub in ("uploads", "videos"):
            (config.data / sub).mkdir(parents=True, exist_ok=True)
        self.store = open_store(s.cache)
        self.records = JobRecords(config.data / "jobs.sqlite")
        self.interrupted = self.records.fail_interrupted()
        worker_settings = {
            "personas": str(s.personas),
            "cache": str(s.cache),
            "models": s.models,
            "loop": s.loop,
        }
        self.queue = JobQueue(self.records, worker_settings, config.workers, config.queue_size)

    def recipe_for_backend(self, backend: str) -> Any:
        recipe = self.config.settings.recipe
        if backend == "musetalk" and not recipe.vae:
            recipe = recipe.replace(vae="sd-vae-ft-mse")  # as `hotplate render` does
        return recipe

    def new_job(
        self, kind: str, persona: str, attire: str, motion: str | None, backend: str
    ) -> Job:
        """Check the names (404 listing the known ones, no path escape) and the backend."""
        from pipeline.personas import PersonaError, resolve
        from pipeline.precompile.recipe import RENDERERS

        if backend not in RENDERERS:
            raise Problem(422, f"backend {backend!r} is not one of {', '.join(RENDERERS)}")
        try:
            found = resolve(self.config.settings.personas, persona, attire, motion)
        except PersonaError as exc:
            raise Problem(404, str(exc)) from None
        return Job(new_id(), kind, found.persona, found.attire, motion, backend, time.time())


def create_app(config: ServeConfig) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service = Service(config)
        app.state.service = service
        await service.queue.start()
        retention = config.retention_hours * 3600
        sweep = asyncio.create_task(
            service.queue.sweep(retention, min(60.0, max(retention / 4, 0.5)), time.time)
        )
        try:
            yield
        finally:
            sweep.cancel()
            await service.queue.stop()

    app = FastAPI(
        title="hotplate",
        summary="Lip-sync renders from hot avatar assets",
        version="1",
        lifespan=lifespan,
    )
    problems.install(app)
    limit = config.max_upload_bytes + FORM_OVERHEAD

    @app.middleware("http")
    async def refuse_large_bodies(request: Request, call_next):
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            return problems.problem_response(
                413,
                f"request body of {int(length) / 1e6:.1f} MB is over the "
                f"{config.max_upload_bytes / 1e6:g} MB upload limit; send a shorter clip",
                request.url.path,
            )
        return await call_next(request)

    def service_of(request: Request) -> Service:
        return request.app.state.service

    def require_token(request: Request) -> None:
        if config.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if not header or scheme.lower() != "bearer":
            raise Problem(
                401,
                "this server needs a token; send 'Authorization: Bearer <token>'",
                {"WWW-Authenticate": "Bearer"},
            )
        if not secrets.compare_digest(given.strip().encode(), config.token.encode()):
            raise Problem(403, "the bearer token is wrong; check HOTPLATE_TOKEN")

    Svc = Annotated[Service, Depends(service_of)]
    Auth = Depends(require_token)

    async def submit_render(svc: Service, form: RenderForm) -> Job:
        audio, motion = form.audio, form.motion or None
        backend = form.backend or svc.config.settings.renderer
        job = await asyncio.to_thread(
            svc.new_job, "render", form.persona, form.attire, motion, backend
        )
        data = svc.config.data
        path = await save_upload(audio, data / "uploads" / job.id, svc.config.max_upload_bytes)
        try:
            job.audio_seconds = await asyncio.to_thread(
                check_audio, path, audio.filename or "audio", svc.config.max_audio_seconds
            )
        except Problem:
            remove(str(path))
            raise
        job.audio, job.video = str(path), str(data / "videos" / f"{job.id}.mp4")
        request_fields = {
            "persona": job.persona,
            "attire": job.attire,
            "motion": motion,
            "audio": path,
            "output": Path(job.video),
            "backend": backend,
        }
        try:
            return svc.queue.submit(job, request_fields, svc.recipe_for_backend(backend))
        except Problem:
            remove(str(path))
            raise

    # -- routes ---------------------------------------------------------------------------

    @app.get("/", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text())

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict:
        """The process answers. `token_required` tells the page to ask for one."""
        return {"status": "ok", "token_required": config.token is not None}

    @app.get("/readyz", tags=["health"])
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

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics(svc: Svc) -> Response:
        return Response(
            render_metrics(svc.queue, svc.store),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.get("/v1/personas", tags=["catalog"])
    def personas(svc: Svc) -> dict:
        """Every persona, attire and motion, hot or cold (and why), size, thumbnail URL."""
        s = svc.config.settings
        return {"personas": list_catalog(svc.store, s.personas, s.recipe)}

    @app.get("/v1/personas/{persona}/{attire}/thumbnail.jpg", tags=["catalog"])
    def persona_thumbnail(svc: Svc, persona: str, attire: str, motion: str | None = None):
        """Frame 0 of the hot avatar, read from the store."""
        s = svc.config.settings
        jpeg = thumbnail(svc.store, s.personas, s.recipe, persona, attire, motion)
        return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "max-age=60"})

    @app.post("/v1/lip-sync", tags=["renders"], dependencies=[Auth], response_class=FileResponse)
    async def lip_sync_route(
        svc: Svc, form: Annotated[RenderForm, Depends(render_form)]
    ) -> FileResponse:
        """Render and wait: returns the MP4. Cold avatars are precompiled first.

        Headers: X-Hotplate-Cache (hit or jit), X-Hotplate-Jit-Seconds,
        X-Hotplate-First-Frame-Seconds, X-Hotplate-Total-Seconds, X-Hotplate-Job.
        """
        job = await submit_render(svc, form)
        while job.state not in FINISHED:
            await svc.queue.wait(job, snapshot(job), 30.0)
        if job.state != "done":
            raise Problem(job.status or 500, job.error or f"the render was {job.state}")
        return FileResponse(
            job.video,
            media_type="video/mp4",
            headers={
                "X-Hotplate-Job": job.id,
                "X-Hotplate-Cache": "jit" if job.jit else "hit",
                "X-Hotplate-Jit-Seconds": f"{job.jit_seconds or 0.0:.3f}",
                "X-Hotplate-First-Frame-Seconds": f"{job.first_frame_seconds or 0.0:.3f}",
                "X-Hotplate-Total-Seconds": f"{job.total_seconds or 0.0:.3f}",
            },
        )

    @app.post("/v1/renders", tags=["renders"], dependencies=[Auth], status_code=202)
    async def create_render(
        svc: Svc, form: Annotated[RenderForm, Depends(render_form)]
    ) -> JSONResponse:
        """Queue a render; poll the status URL or follow its events."""
        job = await submit_render(svc, form)
        return JSONResponse(
            job.public(), status_code=202, headers={"Location": f"/v1/renders/{job.id}"}
        )

    @app.get("/v1/renders", tags=["renders"])
    def list_renders(svc: Svc, limit: int = 50) -> dict:
        """Past and current jobs, newest first."""
        jobs = svc.records.recent(max(1, min(limit, 500)))
        return {"renders": [(svc.queue.live.get(j.id) or j).public() for j in jobs]}

    def job_or_404(svc: Service, job_id: str) -> Job:
        job = svc.queue.get(job_id)
        if job is None:
            raise Problem(404, f"no render {job_id!r}; GET /v1/renders lists them")
        return job

    @app.get("/v1/renders/{job_id}", tags=["renders"])
    def render_status(svc: Svc, job_id: str) -> dict:
        """State, progress (0..1), timings and error of one job."""
        return job_or_404(svc, job_id).public()

    @app.get("/v1/renders/{job_id}/events", tags=["renders"])
    async def render_events(svc: Svc, job_id: str) -> StreamingResponse:
        """Server-Sent Events: `progress` while it runs, then one `done` or `failed`."""
        job = job_or_404(svc, job_id)

        async def stream():
            seen = None
            while True:
                now = snapshot(job)
                if now != seen:
                    seen = now
                    final = job.state in FINISHED
                    event = ("done" if job.state == "done" else "failed") if final else "progress"
                    yield f"event: {event}\ndata: {json.dumps(job.public())}\n\n"
                    if final:
                        return
                else:
                    yield ": keep-alive\n\n"
                await svc.queue.wait(job, seen, 15.0)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/v1/renders/{job_id}/video", tags=["renders"], response_class=FileResponse)
    def render_video(svc: Svc, job_id: str) -> FileResponse:
        """The MP4, with Range support so a <video> can seek."""
        job = job_or_404(svc, job_id)
        if job.state == "expired":
            raise Problem(
                410, f"render {job_id} is older than the retention period; its video was deleted"
            )
        if job.state != "done" or not job.video or not Path(job.video).is_file():
            raise Problem(409, f"render {job_id} is {job.state}; it has no video")
        return FileResponse(
            job.video, media_type="video/mp4", filename=f"{job.persona}-{job.id}.mp4"
        )

    @app.delete("/v1/renders/{job_id}", tags=["renders"], dependencies=[Auth])
    async def delete_render(svc: Svc, job_id: str) -> dict:
        """Cancel a queued or running job (its partial output is removed), or delete a
        finished one with its video."""
        job = job_or_404(svc, job_id)
        if job.state in FINISHED:
            remove(job.video)
            svc.records.delete(job.id)
            return {"id": job.id, "deleted": True}
        await svc.queue.cancel(job)
        return job.public()

    @app.post("/v1/precompile", tags=["renders"], dependencies=[Auth], status_code=202)
    async def precompile_route(
        svc: Svc,
        persona: Annotated[str, Form()],
        attire: Annotated[str, Form()] = "default",
        motion: Annotated[str | None, Form()] = None,
    ) -> JSONResponse:
        """Make an attire (or one motion of it) hot ahead of time, as a queued job."""
        backend = svc.config.settings.renderer
        job = await asyncio.to_thread(
            svc.new_job, "precompile", persona, attire, motion or None, backend
        )
        fields = {"persona": job.persona, "attire": job.attire, "motion": motion or None}
        svc.queue.submit(job, fields, svc.recipe_for_backend(backend))
        return JSONResponse(
            job.public(), status_code=202, headers={"Location": f"/v1/renders/{job.id}"}
        )

    from hotplate.serve.stream_routes import add_routes

    add_routes(app, render_form)  # POST /v1/lip-sync/stream, WS /v1/live
    return app
