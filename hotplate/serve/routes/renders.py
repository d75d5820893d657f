"""Renders and precompiles as jobs: submit, wait, status, events, video, cancel."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

from hotplate.serve.deps import Caller, RenderForm, Svc, check_profile, render_form
from hotplate.serve.guard import Client
from hotplate.serve.problems import Problem, public_text
from hotplate.serve.records import FINISHED, Job, remove, snapshot
from hotplate.serve.uploads import check_audio, save_upload

router = APIRouter(tags=["renders"])


def public(job: Job, queue: Any = None) -> dict:
    """A job as the API shows it: its error without server paths; given the queue, its
    `place` in it (1: the next a worker takes; null once it runs)."""
    out = job.public()
    if out.get("error"):
        out["error"] = public_text(out["error"])
    if queue is not None:
        out["place"] = queue.place(job)
    return out


async def submit_render(svc: Any, form: RenderForm, caller: Client, kind: str = "render") -> Job:
    """Check and queue a render-like job ("render", or "stream": routes/stream.py)."""
    from pipeline.render.profiles import FILE_PROFILE, STREAM_PROFILE

    audio, motion = form.audio, form.motion or None
    backend = form.backend or svc.config.settings.renderer
    profile = check_profile(form.profile, STREAM_PROFILE if kind == "stream" else FILE_PROFILE)
    job = await asyncio.to_thread(svc.new_job, kind, form.persona, form.attire, motion, backend)
    job.owner = caller.id
    data = svc.config.data
    path = await save_upload(audio, data / "uploads" / job.id, svc.config.max_upload_bytes)
    try:
        job.audio_seconds = await asyncio.to_thread(
            check_audio, path, audio.filename or "audio", svc.config.max_audio_seconds
        )
    except BaseException:  # a Problem, or anything else: the upload never outlives it
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
        "profile": profile,
    }
    try:
        return svc.queue.submit(job, request_fields, svc.recipe_for_backend(backend))
    except BaseException:
        remove(str(path))
        raise


def job_or_404(svc: Any, job_id: str) -> Job:
    job = svc.queue.get(job_id)
    if job is None:
        raise Problem(404, f"no render {job_id!r}; GET /v1/renders lists them")
    return job


@router.post("/v1/lip-sync", response_class=FileResponse)
async def lip_sync_route(
    svc: Svc, caller: Caller, form: Annotated[RenderForm, Depends(render_form)]
) -> FileResponse:
    """Render and wait: returns the MP4. Cold avatars are precompiled first.

    Headers: X-Hotplate-Cache (hit or jit), X-Hotplate-Jit-Seconds,
    X-Hotplate-First-Frame-Seconds, X-Hotplate-Total-Seconds, X-Hotplate-Job.
    """
    job = await submit_render(svc, form, caller)
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


@router.post("/v1/renders", status_code=202)
async def create_render(
    svc: Svc, caller: Caller, form: Annotated[RenderForm, Depends(render_form)]
) -> JSONResponse:
    """Queue a render; poll the status URL or follow its events."""
    job = await submit_render(svc, form, caller)
    return JSONResponse(
        public(job, svc.queue), status_code=202, headers={"Location": f"/v1/renders/{job.id}"}
    )


@router.get("/v1/renders")
def list_renders(svc: Svc, caller: Caller, limit: int = 50) -> dict:
    """Past and current jobs, newest first."""
    jobs = svc.records.recent(max(1, min(limit, 500)))
    return {"renders": [public(svc.queue.live.get(j.id) or j) for j in jobs]}


@router.get("/v1/renders/{job_id}")
def render_status(svc: Svc, caller: Caller, job_id: str) -> dict:
    """State, progress (0..1), place in the queue, timings and error of one job."""
    return public(job_or_404(svc, job_id), svc.queue)


@router.get("/v1/renders/{job_id}/events")
async def render_events(svc: Svc, caller: Caller, job_id: str) -> StreamingResponse:
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
                yield f"event: {event}\ndata: {json.dumps(public(job))}\n\n"
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


@router.get("/v1/renders/{job_id}/video", response_class=FileResponse)
def render_video(svc: Svc, caller: Caller, job_id: str) -> FileResponse:
    """The MP4, with Range support so a <video> can seek."""
    job = job_or_404(svc, job_id)
    if job.state == "expired":
        raise Problem(
            410,
            f"render {job_id} expired (kept for --keep-videos, or the data dir was full); "
            "its video was deleted",
        )
    if job.state != "done" or not job.video or not Path(job.video).is_file():
        raise Problem(409, f"render {job_id} is {job.state}; it has no video")
    return FileResponse(job.video, media_type="video/mp4", filename=f"{job.persona}-{job.id}.mp4")


@router.delete("/v1/renders/{job_id}")
async def delete_render(svc: Svc, caller: Caller, job_id: str) -> dict:
    """Cancel a queued or running job (its partial output is removed), or delete a
    finished one with its video. Only the client that created it, or an admin token."""
    job = job_or_404(svc, job_id)
    if not caller.admin and job.owner != caller.id:
        raise Problem(
            403,
            f"render {job_id} belongs to another client; only the token that created it, "
            "or the admin token, may cancel or delete it",
        )
    if job.state in FINISHED:
        remove(job.video)
        svc.records.delete(job.id)
        return {"id": job.id, "deleted": True}
    await svc.queue.cancel(job)
    return public(job)


@router.post("/v1/precompile", status_code=202)
async def precompile_route(
    svc: Svc,
    caller: Caller,
    persona: Annotated[str, Form()],
    attire: Annotated[str, Form()] = "default",
    motion: Annotated[str | None, Form()] = None,
) -> JSONResponse:
    """Make an attire (or one motion of it) hot ahead of time, as a background job: it
    waits however long the renders take (a worker takes it only when no render waits),
    up to --max-queued-precompiles queued; past that 503 with Retry-After."""
    backend = svc.config.settings.renderer
    job = await asyncio.to_thread(
        svc.new_job, "precompile", persona, attire, motion or None, backend
    )
    job.owner = caller.id
    fields = {"persona": job.persona, "attire": job.attire, "motion": motion or None}
    svc.queue.submit(job, fields, svc.recipe_for_backend(backend))
    return JSONResponse(
        public(job, svc.queue), status_code=202, headers={"Location": f"/v1/renders/{job.id}"}
    )


@router.get("/v1/precompile")
def precompile_queue(svc: Svc, caller: Caller) -> dict:
    """The background queue: precompiles running, then those waiting, in the order
    workers take them, each with its place and progress; and how many it may hold."""
    jobs = svc.queue.background()
    return {
        "precompiles": [public(job, svc.queue) for job in jobs],
        "queued": sum(job.state == "queued" for job in jobs),
        "max_queued": svc.queue.background_size,
    }
