"""The ASGI app: the service the routes share, and `create_app`, which includes the
routers (hotplate/serve/routes/: renders, catalog, health, page).

Every request is checked (token, size, names, audio) in the server before it is queued,
so bad input costs no worker time; renders run in worker processes (jobs.py).
A new router is one more `app.include_router(...)` in create_app
(docs/notebook/serving.md, "Routers").
"""

import asyncio
import contextlib
import time
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from hotplate.serve import problems
from hotplate.serve.admission import Admission
from hotplate.serve.config import ServeConfig, seconds
from hotplate.serve.guard import Guard, Policy
from hotplate.serve.metrics import Metrics, RequestTimer
from hotplate.serve.problems import Problem
from hotplate.serve.queue import JobQueue
from hotplate.serve.records import Job, JobRecords, Retention, claim_data_dir, new_id
from hotplate.serve.routes import access, catalog, docs, health, page, renders, sessions, stream

__all__ = ["ServeConfig", "Service", "create_app"]

FORM_OVERHEAD = 64 << 10  # multipart boundaries and the small fields


class Service:
    """What the routes share: config, the store handle, job records and the queue."""

    def __init__(self, config: ServeConfig, metrics: Metrics | None = None) -> None:
        from cachestore.store import open_store

        self.config, s = config, config.settings
        for sub in ("uploads", "videos"):
            (config.data / sub).mkdir(parents=True, exist_ok=True)
        claim_data_dir(config.data)  # one server per data dir; sweeps what a dead one left
        self.store = open_store(s.cache, map_size=s.map_size)
        self.records = JobRecords(config.data / "jobs.sqlite")
        self.interrupted = self.records.fail_interrupted()
        worker_settings = {
            "personas": str(s.personas),
            "cache": str(s.cache),
            "map_size": s.map_size,
            "models": s.models,
            "loop": s.loop,
            "flight_wait": s.flight_wait,  # for another process building the same avatar
        }
        self.metrics = metrics or Metrics()
        self.queue = JobQueue(
            self.records,
            worker_settings,
            config.workers,
            config.queue_size,
            self.metrics,
            Retention(seconds(config.keep_videos), config.data, config.max_data_size),
            max_wait=seconds(config.max_wait),
            background_size=config.max_queued_precompiles,
            cap=config.per_client_cap,
            renderer=s.renderer,
            warm_up=self.recipe_for_backend(s.renderer),  # seeds admission (queue.py)
        )
        from hotplate.serve.sessions import Sessions

        self.sessions = Sessions(self)
        self.watching = None  # serve --watch: the folder's precompiles join the queue
        if config.watch:
            from hotplate.serve.watching import Watching

            self.watching = Watching(self)
        self.metrics.watch(
            lambda: len(self.queue.workers),
            lambda: len(self.queue.running),
            self.queue.depth,
            self.store,
        )

    async def stop_watching(self) -> None:
        """Stop serve --watch's watcher (before a drain: it queues nothing more)."""
        if self.watching is not None:
            await self.watching.stop()

    def recipe_for_backend(self, backend: str) -> Any:
        """The settings' recipe with what `backend` implies (the worker adds persona.toml's),
        by the rule every front end uses: musetalk's VAE is the one in the models dir."""
        from pipeline.precompile.recipe import effective_recipe

        return effective_recipe(self.config.settings.recipe, backend=backend)

    def new_job(
        self, kind: str, persona: str, attire: str, motion: str | None, backend: str
    ) -> Job:
        """Check the names (404 listing the known ones, no path escape) and the backend."""
        from pipeline.personas import PersonaError, resolve
        from pipeline.render.renderers import RENDERERS

        if backend not in RENDERERS:
            raise Problem(422, f"backend {backend!r} is not one of {', '.join(RENDERERS)}")
        try:
            found = resolve(self.config.settings.personas, persona, attire, motion)
        except PersonaError as exc:
            raise Problem(404, str(exc)) from None
        job_id = new_id(self.config.replica)
        return Job(job_id, kind, found.persona, found.attire, motion, backend, time.time())


def create_app(config: ServeConfig) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service = Service(config, metrics)
        app.state.service = service
        await service.queue.start()
        sweep = asyncio.create_task(service.queue.sweep())
        try:
            if service.watching is not None:
                service.watching.start(asyncio.get_running_loop())
            yield
        finally:
            sweep.cancel()
            await service.stop_watching()
            queue = service.queue
            if queue.draining_until is None:  # not drained by a signal (a Ray replica's stop)
                drain_s = seconds(config.drain_timeout)
                await queue.begin_drain(drain_s)
                await service.sessions.end_all("the server is shutting down")
                await queue.drained(drain_s)
            await queue.stop()
            service.sessions.close()

    app = FastAPI(
        title="hotplate",
        summary="Lip-sync renders from hot avatar assets",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # routes/docs.py serves Swagger UI from a package, not a CDN
        redoc_url=None,
    )
    app.state.config = config
    app.state.policy = policy = policy_of(config)
    problems.install(app)
    app.state.metrics = metrics = Metrics()
    # The guard is the outermost layer but for CORS (preflights carry no token) and the
    # timer (a refused request is a request too).
    app.add_middleware(Admission)  # inside the guard: it needs to know the client
    app.add_middleware(Guard, policy=policy)
    if config.allow_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.allow_origins),
            allow_methods=["GET", "POST", "DELETE", "PATCH"],  # PATCH: WHEP's trickle ICE
            allow_headers=["authorization", "if-match"],
            expose_headers=["x-request-id", "location", "x-hotplate-job", "x-hotplate-cache"],
        )
    app.add_middleware(RequestTimer, metrics=metrics)

    app.include_router(page.router)
    app.mount("/static", StaticFiles(directory=str(page.STATIC)), name="static")
    docs.install(app)
    app.include_router(health.router)
    app.include_router(access.router)
    app.include_router(catalog.router)
    app.include_router(renders.router)
    app.include_router(stream.router)  # POST /v1/lip-sync/stream, WS /v1/live
    app.include_router(sessions.router)  # /v1/sessions: conversations over WebRTC
    return app


def policy_of(config: ServeConfig) -> Policy:
    """The guard's rules from the server's flags."""
    return Policy.of(
        config.client_tokens,
        (config.admin_token,) if config.admin_token else (),
        body_limit=config.max_upload_bytes + FORM_OVERHEAD,
        upload_limit=config.max_upload_bytes,
        bound_host=config.host,
        allowed_hosts=config.allowed_hosts,
        allowed_origins=config.allow_origins,
        public_metrics=config.public_metrics,
        key=config.signing_key.encode() if config.signing_key else None,
    )
