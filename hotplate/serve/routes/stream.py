"""The streaming routes: `POST /v1/lip-sync/stream` and `WS /v1/live`.

Both run as jobs on the render workers (kinds "stream" and "live", see stream_jobs.py)
and send the job's fragmented MP4 segment by segment as the worker appends them.

`POST /v1/lip-sync/stream` takes the form `/v1/lip-sync` takes. Every check that
costs no work (token, Origin and Host in the guard; names, audio) answers with a problem as usual; then the response
starts at once, 200 `video/mp4` with chunked transfer and the headers `X-Hotplate-Job`
and `X-Hotplate-Events` (the job's SSE URL). JIT progress on a miss is that SSE channel:
the page opens it when the headers arrive and shows the precompile's steps while the
body has not started yet. A job that fails after the headers ends the body without its
last chunk (the client sees a truncated transfer, never a short "valid" file), and the
job's record says why. A client that goes away cancels the job.

`WS /v1/live`: first message, text JSON {"persona", "attire", "motion"?, "backend"?,
"sample_rate", "channels", "format": "s16le"}; then binary PCM chunks of any size; then
text {"type": "end"}. The server sends the init segment and fragments as binary
messages as soon as they are made, then text {"type": "done", ...timings} or
{"type": "error", "detail"} and closes. Limits: the upload limit in PCM bytes and the
audio-seconds limit; a client that does not read a sent fragment within
SEND_TIMEOUT seconds is dropped with an error (and its job stopped), so the server
holds at most one fragment per client in memory.
"""

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from hotplate.serve.deps import Caller, RenderForm, Svc, render_form
from hotplate.serve.guard import LOCAL
from hotplate.serve.problems import Problem
from hotplate.serve.records import FINISHED, Job, remove, snapshot
from hotplate.serve.routes.renders import submit_render
from hotplate.serve.stream_jobs import PART, SegmentReader, fragment_samples

Service = Any  # app.py's Service (deps.py says why it is not imported)
router = APIRouter(tags=["renders"])

POLL = 0.05  # s: longest wait between looks at the job's growing output
START_TIMEOUT = 10.0  # s: for the first message of a live session
IDLE_TIMEOUT = 30.0  # s: longest silence from a live client before it is dropped
SEND_TIMEOUT = float(os.environ.get("HOTPLATE_LIVE_SEND_TIMEOUT", "10"))  # s
SAMPLE_RATES = (8000, 192000)
MAX_CHANNELS = 8
# close codes (RFC 6455): policy (auth, Origin), unsupported data, too big, server error
POLICY, UNSUPPORTED, TOO_BIG, INTERNAL = 1008, 1003, 1009, 1011


class StreamFailed(RuntimeError):
    """The job failed after the response started: the body must end truncated."""


_background: set[asyncio.Task] = set()


def _later(coro) -> None:
    """Run `coro` even if the caller is being cancelled (a client went away)."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _segments(svc: Service, job: Job):
    """The job's output segments as they appear, until it finishes."""
    reader = SegmentReader(Path(job.video))
    try:
        while True:
            finished = job.state in FINISHED  # before reading: a done job's file is whole
            for seg in await asyncio.to_thread(reader.read):
                yield seg
            if finished:
                if job.state != "done":
                    raise StreamFailed(job.error or f"the render was {job.state}")
                return
            await svc.queue.wait(job, snapshot(job), POLL)
    finally:
        reader.close()


@router.post(
    "/v1/lip-sync/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"video/mp4": {}}}},
)
async def lip_sync_stream(
    svc: Svc, caller: Caller, form: Annotated[RenderForm, Depends(render_form)]
) -> StreamingResponse:
    """Render and stream: a fragmented MP4 sent as it is made (see the module doc).

    Headers: X-Hotplate-Job, X-Hotplate-Events (SSE progress, JIT included)."""
    job = await submit_render(svc, form, caller, kind="stream")

    async def body():
        first = True
        try:
            async for seg in _segments(svc, job):
                if first and seg[4:8] == b"moof":
                    first = False
                    svc.metrics.first_fragment.labels("stream").observe(time.time() - job.created)
                yield seg
        finally:
            if job.state not in FINISHED:  # the client went away: stop the render
                _later(svc.queue.cancel(job))

    return StreamingResponse(
        body(),
        media_type="video/mp4",
        headers={
            "X-Hotplate-Job": job.id,
            "X-Hotplate-Events": f"/v1/renders/{job.id}/events",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        },
    )


class LiveError(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def _start_fields(msg: dict) -> dict:
    """The start message, checked; LiveError naming the field and the fix."""
    if msg.get("type") != "websocket.receive" or msg.get("text") is None:
        raise LiveError(UNSUPPORTED, "the first message must be text JSON (the start message)")
    try:
        start = json.loads(msg["text"])
    except ValueError:
        raise LiveError(UNSUPPORTED, "the start message is not JSON") from None
    if not isinstance(start, dict):
        raise LiveError(UNSUPPORTED, "the start message must be a JSON object")
    for key in ("persona", "attire"):
        if not isinstance(start.get(key), str) or not start[key]:
            raise LiveError(UNSUPPORTED, f"the start message needs {key!r}, a name")
    if start.get("format", "s16le") != "s16le":
        raise LiveError(
            UNSUPPORTED, f"format {start.get('format')!r} is not supported; send 's16le' PCM"
        )
    rate, channels = start.get("sample_rate"), start.get("channels", 1)
    if not isinstance(rate, int) or not SAMPLE_RATES[0] <= rate <= SAMPLE_RATES[1]:
        raise LiveError(
            UNSUPPORTED,
            f"sample_rate {rate!r} must be an integer from {SAMPLE_RATES[0]} to "
            f"{SAMPLE_RATES[1]} Hz",
        )
    if not isinstance(channels, int) or not 1 <= channels <= MAX_CHANNELS:
        raise LiveError(UNSUPPORTED, f"channels {channels!r} must be 1 to {MAX_CHANNELS}")
    for key in ("motion", "backend"):
        if start.get(key) is not None and not isinstance(start[key], str):
            raise LiveError(UNSUPPORTED, f"{key!r} must be a name")
    return start


@router.websocket("/v1/live")
async def live(ws: WebSocket) -> None:
    """Live lip-sync over a WebSocket (see the module doc for the protocol)."""
    # token, Origin, Host and the byte budget were checked by the guard (guard.py)
    svc: Service = ws.app.state.service
    await ws.accept()
    job: Job | None = None
    part: Path | None = None
    timings: dict[str, float] = {}
    failure: str | None = "the live client went away"
    code: int | None = None  # close code for the error sent to the client
    try:
        try:
            first = await asyncio.wait_for(ws.receive(), START_TIMEOUT)
        except TimeoutError:
            raise LiveError(POLICY, f"no start message within {START_TIMEOUT:g} s") from None
        if first["type"] == "websocket.disconnect":
            return
        start = _start_fields(first)
        backend = start.get("backend") or svc.config.settings.renderer
        try:
            job = await asyncio.to_thread(
                svc.new_job, "live", start["persona"], start["attire"], start.get("motion"), backend
            )
        except Problem as exc:
            raise LiveError(POLICY if exc.status != 404 else UNSUPPORTED, exc.detail) from None
        job.owner = ws.scope.get("state", {}).get("client", LOCAL).id
        data = svc.config.data
        part = data / "uploads" / f"{job.id}.pcm{PART}"
        part.touch()
        final = part.with_name(part.name.removesuffix(PART))
        job.audio, job.video = str(final), str(data / "videos" / f"{job.id}.mp4")
        fields = {
            "persona": job.persona,
            "attire": job.attire,
            "motion": job.motion,
            "backend": backend,
            "pcm": str(part),
            "sample_rate": start["sample_rate"],
            "channels": start["channels"] if "channels" in start else 1,
            "output": job.video,
        }
        try:
            svc.queue.submit(job, fields, svc.recipe_for_backend(backend))
        except Problem as exc:
            raise LiveError(INTERNAL, exc.detail) from None
        bytes_per_second = fields["sample_rate"] * fields["channels"] * 2
        limit = min(
            svc.config.max_upload_bytes, int(svc.config.max_audio_seconds * bytes_per_second)
        )
        receiver = asyncio.create_task(_receive(ws, part, limit, timings))
        sender = asyncio.create_task(_send(ws, svc, job, timings))
        done, _ = await asyncio.wait({receiver, sender}, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                receiver.cancel()
                sender.cancel()
                raise task.exception()
        await sender  # the receiver ended first (the end message): wait for the output
        await ws.send_text(json.dumps({"type": "done", **_timings(job, timings)}))
        failure = None
        await ws.close()
    except WebSocketDisconnect:
        pass  # the client went away; the job is stopped below
    except LiveError as exc:
        failure, code = exc.detail, exc.code
    except Exception as exc:  # noqa: BLE001 - reported to the client, then the job stopped
        failure = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        code = INTERNAL
    finally:
        # first stop the job and clean up, then tell the client: once it sees the close,
        # nothing of the session is left
        await _stop(svc, job, part, failure)
    if failure is not None and code is not None:
        await _error(ws, code, failure)


async def _error(ws: WebSocket, code: int, detail: str) -> None:
    try:
        await asyncio.wait_for(ws.send_text(json.dumps({"type": "error", "detail": detail})), 2.0)
        await asyncio.wait_for(ws.close(code=code, reason=detail[:120]), 2.0)
    except Exception:  # noqa: BLE001 - the client is gone or not reading
        pass


async def _stop(svc: Service, job: Job | None, part: Path | None, failure: str | None) -> None:
    """End the job if it still runs and leave no file behind: a session that failed
    keeps no video, and its record says why."""
    if part is not None:
        part.unlink(missing_ok=True)  # a worker still reading input sees it gone and stops
    if job is None or failure is None:
        return
    if job.state == "queued" or (job.state == "running" and Path(job.audio).exists()):
        await svc.queue.cancel(job)  # queued, or its input is whole: it would not stop
    deadline = time.monotonic() + 10.0
    while job.state not in FINISHED and time.monotonic() < deadline:
        await svc.queue.wait(job, snapshot(job), 1.0)
    if job.state not in FINISHED:  # it did not stop on its own: kill it
        await svc.queue.cancel(job)
    remove(job.video)
    job.video, job.error = None, f"live session failed: {failure}"
    svc.records.save(job)


async def _receive(ws: WebSocket, part: Path, limit: int, timings: dict) -> None:
    """PCM chunks into the job's input file until the end message."""
    got = 0
    with open(part, "ab") as f:
        while True:
            try:
                msg = await asyncio.wait_for(ws.receive(), IDLE_TIMEOUT)
            except TimeoutError:
                raise LiveError(
                    POLICY, f"no message for {IDLE_TIMEOUT:g} s; send PCM or end"
                ) from None
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", 1000))
            if msg.get("bytes") is not None:
                chunk = msg["bytes"]
                got += len(chunk)
                if got > limit:
                    raise LiveError(
                        TOO_BIG,
                        f"live audio over the limit of {limit} bytes of PCM; send a shorter take",
                    )
                if chunk and "first_audio" not in timings:
                    timings["first_audio"] = time.perf_counter()
                f.write(chunk)
                f.flush()
                continue
            try:
                end = json.loads(msg.get("text") or "")
            except ValueError:
                end = None
            if not isinstance(end, dict) or end.get("type") != "end":
                raise LiveError(
                    UNSUPPORTED, 'after the start message send binary PCM, then {"type": "end"}'
                )
            if got == 0:
                raise LiveError(UNSUPPORTED, "the live input ended before any PCM was sent")
            timings["end"] = time.perf_counter()
            part.rename(part.with_name(part.name.removesuffix(PART)))
            return


async def _send(ws: WebSocket, svc: Service, job: Job, timings: dict) -> None:
    """The job's segments to the client as they appear; raises LiveError when the job
    fails or the client does not read."""
    try:
        async for seg in _segments(svc, job):
            try:
                await asyncio.wait_for(ws.send_bytes(seg), SEND_TIMEOUT)
            except TimeoutError:
                raise LiveError(
                    POLICY, f"the client read nothing for {SEND_TIMEOUT:g} s; dropped"
                ) from None
            if seg[4:8] == b"moof":
                if "first_fragment" not in timings and "first_audio" in timings:
                    seconds = time.perf_counter() - timings["first_audio"]
                    svc.metrics.first_fragment.labels("live").observe(seconds)
                timings.setdefault("first_fragment", time.perf_counter())
                timings["frames"] = timings.get("frames", 0) + fragment_samples(seg)
                timings["fragments"] = timings.get("fragments", 0) + 1
        timings["last"] = time.perf_counter()
    except StreamFailed as exc:
        raise LiveError(INTERNAL, str(exc)) from None


def _timings(job: Job, t: dict) -> dict:
    out = {
        "job": job.id,
        "frames": t.get("frames", 0),
        "fragments": t.get("fragments", 0),
        "audio_seconds": job.audio_seconds,
        "jit": job.jit,
        "jit_seconds": job.jit_seconds,
    }
    if "first_audio" in t and "first_fragment" in t:
        out["first_fragment_seconds"] = round(t["first_fragment"] - t["first_audio"], 4)
    if "end" in t and "last" in t:
        out["end_lag_seconds"] = round(t["last"] - t["end"], 4)
    return out
