"""The streaming routes: `POST /v1/lip-sync/stream` and `WS /v1/live`.

Both run as jobs on the render workers (kinds "stream" and "live", see stream_jobs.py)
and send the job's fragmented MP4 segment by segment as the worker appends them.

`POST /v1/lip-sync/stream` takes the form `/v1/lip-sync` takes (its `profile` is
preview unless told). Every check that
costs no work (token, Origin and Host in the guard; names, audio) answers with a problem as usual; then the response
starts at once, 200 `video/mp4` with chunked transfer and the headers `X-Hotplate-Job`
and `X-Hotplate-Events` (the job's SSE URL). JIT progress on a miss is that SSE channel:
the page opens it when the headers arrive and shows the precompile's steps while the
body has not started yet. A job that fails after the headers ends the body without its
last chunk (the client sees a truncated transfer, never a short "valid" file), and the
job's record says why. A client that goes away cancels the job, and so does one that
leaves a segment unsent for SEND_TIMEOUT seconds (it is dropped): segments are read from
the job's file one at a time, as the client takes them.

`WS /v1/live`: first message, text JSON {"persona", "attire", "motion"?, "backend"?,
"profile"? (preview unless told), "sample_rate", "channels", "format": "s16le"}; then binary PCM chunks of any size; then
text {"type": "end"}. The server sends the init segment and fragments as binary
messages as soon as they are made, then text {"type": "done", ...timings} or
{"type": "error", "detail"} and closes. Limits: the upload limit in PCM bytes and the
audio-seconds limit; input at least MIN_RATE of real time after RATE_SLACK seconds; the
whole session at most the audio limit at real time plus GRACE; a client that does not
read a sent fragment within SEND_TIMEOUT seconds is dropped with an error (and its job
stopped), so the server holds at most one fragment per client in memory. A session the
full queue refuses is closed with 1013 and leaves no job record. PCM is written off the
event loop, so a slow disk delays only its own session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from asyncio import FIRST_COMPLETED
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from hotplate.serve.deps import Caller, RenderForm, Svc, check_profile, render_form
from hotplate.serve.guard import LOCAL
from hotplate.serve.problems import Problem
from hotplate.serve.records import FINISHED, Job, remove, snapshot
from hotplate.serve.routes.renders import submit_render
from hotplate.serve.stream_jobs import PART, SegmentReader, fragment_samples
from pipeline.render.profiles import STREAM_PROFILE

Service = Any  # app.py's Service (deps.py says why it is not imported)
router = APIRouter(tags=["renders"])
log = logging.getLogger("hotplate.serve")

POLL = 0.05  # s: longest wait between looks at the job's growing output
START_TIMEOUT = 10.0  # s: for the first message of a live session
IDLE_TIMEOUT = 30.0  # s: longest silence from a live client before it is dropped
# s: a client that leaves a segment unread this long is dropped (both streaming routes)
SEND_TIMEOUT = float(os.environ.get("HOTPLATE_LIVE_SEND_TIMEOUT", "10"))
# s: a live session lasts at most its audio limit at real time plus this (the render's
# tail and the last fragments' trip)
GRACE = float(os.environ.get("HOTPLATE_LIVE_GRACE", "30"))
MIN_RATE, RATE_SLACK = 0.5, 5.0  # live input: at least half real time after the first 5 s
SAMPLE_RATES = (8000, 192000)
MAX_CHANNELS = 8
# close codes (RFC 6455 and IANA's registry): policy (auth, Origin, timeouts), unsupported
# data, too big, server error, try again later (the queue is full)
POLICY, UNSUPPORTED, TOO_BIG, INTERNAL, TRY_LATER = 1008, 1003, 1009, 1011, 1013


class StreamFailed(RuntimeError):
    """The job failed after the response started: the body must end truncated."""


_background: set[asyncio.Task] = set()


def _later(coro) -> None:
    """Run `coro` even if the caller is being cancelled (a client went away)."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _segments(svc: Service, job: Job):
    """The job's output segments as they appear, one at a time, until it finishes: the
    next is read only once the client has taken this one (a slow client holds back
    disk bytes, never the backlog in memory)."""
    reader = SegmentReader(Path(job.video))
    try:
        while True:
            finished = job.state in FINISHED  # before reading: a done job's file is whole
            segment = await asyncio.to_thread(reader.read)
            if segment is not None:
                yield segment
                continue
            if finished:
                if job.state != "done":
                    raise StreamFailed(job.error or f"the render was {job.state}")
                return
            await svc.queue.wait(job, snapshot(job), POLL)
    finally:
        reader.close()


class ClientStalled(Exception):
    """The client read nothing for SEND_TIMEOUT seconds."""


class SegmentStream(StreamingResponse):
    """A StreamingResponse whose every send must complete within SEND_TIMEOUT: a client
    that stops reading is dropped (`on_stalled()` is called, the body iterator closed,
    and the response ends truncated: uvicorn closes the connection)."""

    def __init__(self, content: Any, on_stalled: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.on_stalled = on_stalled

    async def stream_response(self, send: Any) -> None:
        async def timed(message: dict) -> None:
            try:
                await asyncio.wait_for(send(message), SEND_TIMEOUT)
            except TimeoutError:
                self.on_stalled()
                raise ClientStalled from None

        try:
            await super().stream_response(timed)
        finally:
            await self.body_iterator.aclose()  # now, not when the generator is collected

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        with contextlib.suppress(ClientStalled):  # said in one line by on_stalled
            await super().__call__(scope, receive, send)


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
    gone = ["the client went away"]  # why the render stops if the body ends early

    async def body():
        first = True
        try:
            async with contextlib.aclosing(_segments(svc, job)) as segments:
                async for seg in segments:
                    if first and seg[4:8] == b"moof":
                        first = False
                        seconds = time.time() - job.created
                        svc.metrics.first_fragment.labels("stream").observe(seconds)
                    yield seg
        finally:
            if job.state not in FINISHED:  # the client went away: stop the render
                _later(svc.queue.cancel(job, gone[0]))

    def stalled() -> None:
        gone[0] = f"the client read nothing for {SEND_TIMEOUT:g} s; dropped"
        log.info("stream %s: %s", job.id, gone[0])

    return SegmentStream(
        body(),
        stalled,
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
    for key in ("motion", "backend", "profile"):
        if start.get(key) is not None and not isinstance(start[key], str):
            raise LiveError(UNSUPPORTED, f"{key!r} must be a name")
    try:
        start["profile"] = check_profile(start.get("profile"), STREAM_PROFILE)
    except Problem as exc:
        raise LiveError(UNSUPPORTED, exc.detail) from None
    return start


@router.websocket("/v1/live")
async def live(ws: WebSocket) -> None:
    """Live lip-sync over a WebSocket (see the module doc for the protocol)."""
    # token, Origin, Host and the byte budget were checked by the guard (guard.py)
    svc: Service = ws.app.state.service
    await ws.accept()
    job: Job | None = None  # once it is queued: a session refused before has no record
    part: Path | None = None
    pcm: PcmFile | None = None
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
        started = asyncio.get_running_loop().time()
        start = _start_fields(first)
        backend = start.get("backend") or svc.config.settings.renderer
        try:
            new = await asyncio.to_thread(
                svc.new_job, "live", start["persona"], start["attire"], start.get("motion"), backend
            )
        except Problem as exc:
            raise LiveError(POLICY if exc.status != 404 else UNSUPPORTED, exc.detail) from None
        new.owner = ws.scope.get("state", {}).get("client", LOCAL).id
        data = svc.config.data
        part = data / "uploads" / f"{new.id}.pcm{PART}"
        final = part.with_name(part.name.removesuffix(PART))
        new.audio, new.video = str(final), str(data / "videos" / f"{new.id}.mp4")
        fields = {
            "persona": new.persona,
            "attire": new.attire,
            "motion": new.motion,
            "backend": backend,
            "profile": start["profile"],
            "pcm": str(part),
            "sample_rate": start["sample_rate"],
            "channels": start["channels"] if "channels" in start else 1,
            "output": new.video,
        }
        pcm = await PcmFile.create(part)
        try:
            job = svc.queue.submit(new, fields, svc.recipe_for_backend(backend))
        except Problem as exc:  # the queue is full: try again later (RFC 6455's 1013)
            raise LiveError(TRY_LATER if exc.status == 503 else INTERNAL, exc.detail) from None
        rate = Pace(fields["sample_rate"] * fields["channels"] * 2, started)
        limit = min(svc.config.max_upload_bytes, int(svc.config.max_audio_seconds * rate.per_s))
        # the whole session: its audio limit at real time, plus the render's tail
        deadline = started + limit / rate.per_s + GRACE
        receiver = asyncio.create_task(_receive(ws, pcm, limit, rate, timings))
        sender = asyncio.create_task(_send(ws, svc, job, timings))
        try:
            await _until(deadline, deadline - started, receiver, sender)
        finally:
            receiver.cancel()
            sender.cancel()
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
        if pcm is not None:
            await pcm.close()
        await _stop(svc, job, part, failure)
    if failure is not None and code is not None:
        await _error(ws, code, failure)


async def _until(
    deadline: float, seconds: float, receiver: asyncio.Task, sender: asyncio.Task
) -> None:
    """Wait for both tasks (the input ends first, then the output); raise the first
    one's error, or LiveError once the session passes `deadline` (loop time; `seconds`
    after its start)."""
    loop = asyncio.get_running_loop()
    pending = {receiver, sender}
    while pending:
        done, pending = await asyncio.wait(
            pending, timeout=max(0.0, deadline - loop.time()), return_when=FIRST_COMPLETED
        )
        if not done:
            raise LiveError(
                POLICY,
                f"the live session passed its {seconds:.0f} s limit (the audio limit at real "
                "time plus a grace); send the audio as it is spoken",
            )
        for task in done:
            if task.exception() is not None:
                raise task.exception()


async def _error(ws: WebSocket, code: int, detail: str) -> None:
    try:
        await asyncio.wait_for(ws.send_text(json.dumps({"type": "error", "detail": detail})), 2.0)
        await asyncio.wait_for(ws.close(code=code, reason=detail[:120]), 2.0)
    except Exception:  # noqa: BLE001 - the client is gone or not reading
        pass


async def _stop(svc: Service, job: Job | None, part: Path | None, failure: str | None) -> None:
    """End the job if it still runs and leave no file behind: a session that failed
    keeps no video, and its record says why."""
    if part is not None:  # a worker still reading input sees it gone and stops
        await asyncio.to_thread(part.unlink, missing_ok=True)
    if job is None or failure is None:
        return
    if job.state == "queued" or (job.state == "running" and Path(job.audio).exists()):
        await svc.queue.cancel(job, f"live session failed: {failure}")  # it would not stop
    deadline = time.monotonic() + 10.0
    while job.state not in FINISHED and time.monotonic() < deadline:
        await svc.queue.wait(job, snapshot(job), 1.0)
    if job.state not in FINISHED:  # it did not stop on its own: kill it
        await svc.queue.cancel(job, f"live session failed: {failure}")
    remove(job.video)
    job.video, job.error = None, f"live session failed: {failure}"
    svc.records.save(job)


class PcmFile:
    """The live input file, written off the event loop: a slow disk delays this
    session's input, never the other clients the loop serves."""

    def __init__(self, part: Path, f: Any) -> None:
        self.part, self.f = part, f

    @classmethod
    async def create(cls, part: Path) -> PcmFile:
        return cls(part, await asyncio.to_thread(open, part, "ab"))

    async def write(self, chunk: bytes) -> None:
        def write() -> None:
            self.f.write(chunk)
            self.f.flush()

        await asyncio.to_thread(write)

    async def end(self) -> None:
        """The end message: the worker reads what is left, then stops."""
        await self.close()
        await asyncio.to_thread(
            self.part.rename, self.part.with_name(self.part.name.removesuffix(PART))
        )

    async def close(self) -> None:
        if not self.f.closed:
            await asyncio.to_thread(self.f.close)


class Pace:
    """How much input a live session owes by now: after RATE_SLACK seconds, at least
    MIN_RATE of real time (a client trickling bytes would hold a worker forever)."""

    def __init__(self, per_s: int, started: float) -> None:
        self.per_s, self.started = per_s, started

    def due(self, got: int) -> float:
        """Loop time by which more than `got` bytes must have come."""
        return self.started + RATE_SLACK + got / self.per_s / MIN_RATE


async def _receive(ws: WebSocket, pcm: PcmFile, limit: int, pace: Pace, timings: dict) -> None:
    """PCM chunks into the job's input file until the end message."""
    loop = asyncio.get_running_loop()
    got = 0
    while True:
        owed = pace.due(got) - loop.time()  # seconds until this input is too slow
        try:
            msg = await asyncio.wait_for(ws.receive(), max(0.0, min(IDLE_TIMEOUT, owed)))
        except TimeoutError:
            if owed <= IDLE_TIMEOUT:
                raise LiveError(
                    POLICY,
                    f"live audio arrives slower than {MIN_RATE:g}x real time "
                    f"({got / pace.per_s:.1f} s of audio in {loop.time() - pace.started:.0f} s); "
                    "send it as it is spoken",
                ) from None
            raise LiveError(POLICY, f"no message for {IDLE_TIMEOUT:g} s; send PCM or end") from None
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
            await pcm.write(chunk)
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
        await pcm.end()
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
