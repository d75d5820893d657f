"""Render worker processes: each opens the store once and keeps the models it loads.

Like the watcher's workers they start by watcher/process.py: spawned, never forked (LMDB
and torch must be opened fresh), die with the server (PR_SET_PDEATHSIG) and keep models
in pipeline/nets/modelcache.py for as long as they live. One job at a time, on a pipe:

    server -> worker   (job_id, kind, fields, recipe)   or None to exit
    worker -> server   ("ready", pid) once, then per job
                       ("taken", job_id) as it is received (before: nothing of it ran)
                       ("progress", job_id, step, done, total) ...
                       ("jit", job_id) once, when the avatar is cold and is built first
                       ("ok", job_id, result) | ("error", job_id, http_status, one_line)

kind "render" runs pipeline.lip_sync.lip_sync (the entry point `hotplate render`
uses); kind "precompile" runs pipeline.precompile.run.precompile on the resolved source,
or, for a file the server's watcher queued (fields["source"]), what `hotplate watch`'s
worker runs on it (`precompile_file`);
kinds "stream" and "live" write a fragmented MP4 as it is made (stream_jobs.py); kind
"talk" holds a conversation session until it ends (talk.py); kind
"warm-up" (sent once by the queue after every worker is ready) renders a short clip of
each avatar size the store holds hot and answers what each cost (`warm_up_renders`).
Cancelling a running job kills its worker; the pool starts another.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from watcher.process import enter, messages, one_line, spawn

WARM_UP_AUDIO = 2.0  # s: the measured warm-up clip (a 1080x1920 warp render: about 3 s)
PRIMING_AUDIO = 0.2  # s: rendered first, unmeasured: a process's first render of a size
MAX_WARM_UP_SIZES = 3  # avatar sizes measured at start; others are learned as they render


def status_for(exc: BaseException) -> int:
    """The HTTP status an exception from a job maps to (4xx: the request's fault)."""
    from cachestore.codec import CodecError
    from cachestore.flight import FlightTimeoutError
    from cachestore.keys import FileChangedError
    from pipeline.nets.models import ModelMissingError
    from pipeline.personas import PersonaError
    from pipeline.render.audio import AudioError, AudioFormatError

    if isinstance(exc, PersonaError):
        return 404
    if isinstance(exc, AudioError):
        return 415 if isinstance(exc, AudioFormatError) else 422
    if isinstance(exc, ModelMissingError | FlightTimeoutError):  # weights, or a build elsewhere
        return 503
    if isinstance(exc, LookupError | FileChangedError):  # FileChangedError: serve --watch's
        return 409
    if isinstance(exc, CodecError):  # the store's own damage (a ValueError): never a 4xx
        return 500
    if isinstance(exc, ValueError):  # MediaError, NoFaceError, bad options
        return 422
    return 500


class Throttle:
    """Sends a progress message when the step changes or a whole percent passes, and
    (`segment`) when a stream's segment is in its file: the server, which waits on the
    job's progress, then sends it at once instead of at its next look. Thread-safe: a
    stream's segments are written on the render's encode thread."""

    def __init__(self, conn: Any, job_id: str) -> None:
        import threading

        self.conn, self.job_id, self.last = conn, job_id, (None, -1)
        self.latest: tuple[str, int, int] | None = None  # the last (step, done, total) seen
        self.sent: tuple[str, int, int] | None = None
        self.lock = threading.Lock()

    def __call__(self, step: str, done: int, total: int) -> None:
        percent = int(100 * done / total) if total else 0
        with self.lock:
            self.latest = (step, done, total)
            if (step, percent) != self.last:
                self.last = (step, percent)
                self._send()

    def segment(self, kind: str, data: bytes) -> None:
        """A stream's sink: the segment is in the file (render/video.py's tee writes it
        first); say so, unless the server knows this progress already."""
        with self.lock:
            if self.latest is not None and self.latest != self.sent:
                self._send()

    def _send(self) -> None:
        self.sent = self.latest
        self.conn.send(("progress", self.job_id, *self.latest))

    def jit(self) -> None:
        """The avatar is cold: the job precompiles it before it renders."""
        self.conn.send(("jit", self.job_id))


def run_job(
    store: Any, settings: dict[str, Any], kind: str, fields: dict, recipe: Any, progress: Throttle
):
    """One job's result dict; raises what lip_sync or precompile raise."""
    personas = Path(settings["personas"])
    if kind == "warm-up":
        return {"renders": warm_up_renders(store, settings, fields["backend"], recipe)}
    if kind == "talk":  # a conversation session over WebRTC: talk.py
        from hotplate.serve.talk import run_talk_job

        return run_talk_job(store, settings, fields, recipe, progress, status_for)
    if kind == "live":  # audio arriving as it is spoken: stream_jobs.py
        from hotplate.serve.stream_jobs import run_live_job

        return run_live_job(store, settings, fields, recipe, progress)
    if kind in ("render", "stream"):
        from contextlib import nullcontext

        from pipeline.lip_sync import LipSyncRequest, lip_sync
        from pipeline.render.video import streaming_to

        request = LipSyncRequest(**fields)
        # a stream's render_video writes the fragmented file as it grows; the server reads it
        fragmented = streaming_to(progress.segment) if kind == "stream" else nullcontext()
        with fragmented:
            outcome = lip_sync(
                store,
                personas,
                recipe,
                request,
                settings["loop"],
                progress=progress,
                flight_wait=settings["flight_wait"],
                on_jit=progress.jit,
            )
        return {
            "avatar": outcome.avatar,
            "jit": outcome.jit,
            "jit_seconds": outcome.jit_seconds,
            "first_frame_seconds": outcome.first_frame_seconds,
            "frames": outcome.render.frames,
            "audio_seconds": outcome.render.audio_seconds,
            "size": avatar_size(store, outcome.avatar),
        }
    if "source" in fields:  # a file the server's watcher found (serve --watch, watching.py)
        return precompile_file(store, settings, fields, recipe, progress)
    from pipeline.catalog import recipe_for
    from pipeline.personas import resolve
    from pipeline.precompile.run import precompile

    found = resolve(personas, fields["persona"], fields["attire"], fields.get("motion"))
    report = precompile(
        found.path,
        recipe_for(personas, found.persona, recipe),
        store,
        progress=lambda stage, done, total: progress(stage, done, total),
        flight_wait=settings["flight_wait"],
    )
    return {"avatar": report.avatar, "jit": not report.hit, "frames": report.counts.get("frames")}


def precompile_file(
    store: Any, settings: dict[str, Any], fields: dict, recipe: Any, progress: Throttle
) -> dict:
    """What `hotplate watch`'s worker does with a file (watcher/worker.py: its avatar and
    its bank, the file unchanged throughout, else FileChangedError, a 409), with progress."""
    from functools import partial

    from watcher.worker import precompile_job, run_checked

    job = partial(precompile_job, flight_wait=settings["flight_wait"], progress=progress)
    result = run_checked(job, Path(fields["source"]), recipe, store, fields["stat"])
    return {**result, "jit": not result["hit"]}


def avatar_size(store: Any, avatar: str) -> str | None:
    """The avatar's frame size as WxH (what a render's cost follows), None when unknown."""
    manifest = store.get_avatar(avatar)
    return f"{manifest['width']}x{manifest['height']}" if manifest else None


def hot_sizes(store: Any, personas: Path, recipe: Any, backend: str) -> dict[str, Any]:
    """WxH -> the first hot source of that size (catalog order), at most MAX_WARM_UP_SIZES."""
    from pipeline.catalog import iter_sources, plan_for, recipe_for

    found: dict[str, Any] = {}
    for src in iter_sources(personas):
        if src.kind == "speech":  # talking footage for the mouth bank, not an attire
            continue
        try:
            planned = plan_for(store, src.path, recipe_for(personas, src.persona, recipe, backend))
        except (OSError, ValueError):
            continue
        size = avatar_size(store, planned.avatar)
        if size is not None:
            found.setdefault(size, src)
        if len(found) >= MAX_WARM_UP_SIZES:
            break
    return found


class Uncounted:
    """The store, but its counters (hits) left alone: a warm-up render is no request."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def count(self, name: str, n: int = 1) -> None:
        pass


def warm_up_renders(store: Any, settings: dict[str, Any], backend: str, recipe: Any) -> list:
    """Render a WARM_UP_AUDIO clip of generated speech on one hot source of each avatar
    size (after an unmeasured PRIMING_AUDIO one: a process's first render of a size pays
    for allocations a worker pays once), and say what each took: the seed of admission's
    estimate. The outputs are thrown away; a source that cannot render (cold since it
    was listed, weights missing) is skipped with one line on stderr, never fails the
    start. An empty store renders nothing (admission starts from its priors)."""
    from hotplate.demo_data import make_speech_audio, write_wav
    from pipeline.lip_sync import LipSyncRequest, lip_sync

    personas, store = Path(settings["personas"]), Uncounted(store)
    renders = []
    with tempfile.TemporaryDirectory(prefix="hotplate-warm-up-") as tmp:
        clips = {}
        for name, seconds in (("priming", PRIMING_AUDIO), ("measured", WARM_UP_AUDIO)):
            clips[name] = write_wav(Path(tmp) / f"{name}.wav", make_speech_audio(seconds), 16000)
        for size, src in hot_sizes(store, personas, recipe, backend).items():

            def render(clip: Path, src: Any = src) -> Any:
                out = Path(tmp) / "out.mp4"
                request = LipSyncRequest(  # no_jit: a source gone cold is skipped, not built
                    src.persona, src.attire, clip, out, src.motion, backend=backend, no_jit=True
                )
                return lip_sync(store, personas, recipe, request, settings["loop"])

            try:
                render(clips["priming"])
                began = time.perf_counter()
                outcome = render(clips["measured"])
                took = time.perf_counter() - began
            except Exception as exc:  # the server starts without this seed
                why = f"warm-up render of {src.path.name} skipped: {one_line(exc)}"
                print(f"hotplate serve: {why}", file=sys.stderr, flush=True)
                continue
            renders.append(
                {
                    "backend": backend,
                    "size": size,
                    "seconds": took,
                    "audio_seconds": outcome.render.audio_seconds,
                    "first_frame_seconds": outcome.first_frame_seconds,
                    "names": [src.persona, src.attire, src.motion],
                }
            )
    return renders


def worker_main(conn: Any, parent: int, settings: dict[str, Any]) -> None:
    """Entry point of a spawned render worker."""
    if not enter(parent):  # dies with the server, which decides when workers stop
        return
    from cachestore.store import open_store

    store = open_store(settings["cache"], map_size=settings.get("map_size"))
    from pipeline.render.video import return_freed_memory, warm_up

    warm_up()  # the first request's first fragment then comes as the second's does
    conn.send(("ready", os.getpid()))
    for msg in messages(conn):
        job_id, kind, fields, recipe = msg
        conn.send(("taken", job_id))  # a death before this: the job may go to a fresh worker
        try:
            result = run_job(store, settings, kind, fields, recipe, Throttle(conn, job_id))
        except Exception as exc:
            conn.send(("error", job_id, status_for(exc), one_line(exc)))
        else:
            conn.send(("ok", job_id, result))
        return_freed_memory()  # what the job freed goes back before the next one comes


class RenderWorker:
    """The server's handle on one worker process (blocking calls: run them in a thread)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.process: Any = None
        self.conn: Any = None

    def start(self) -> None:
        self.process, self.conn = spawn(worker_main, (self.settings,), "hotplate-render-worker")
        ready = self.recv()
        if ready is None or ready[0] != "ready":
            raise RuntimeError(f"render worker failed to start (exit code {self.exitcode()})")

    def send(self, message: Any) -> None:
        self.conn.send(message)

    def warm_up_renders(self, fields: dict, recipe: Any) -> list[dict]:
        """The worker's warm-up renders (module doc; blocking), [] if it could not."""
        self.send(("warm-up", "warm-up", fields, recipe))
        while (msg := self.recv()) is not None:
            if msg[0] == "ok":
                return msg[2]["renders"]
            if msg[0] == "error":
                print(f"hotplate serve: warm-up failed: {msg[3]}", file=sys.stderr, flush=True)
                return []
        return []

    def recv(self) -> Any:
        """The next message, or None when the worker died."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def exitcode(self) -> int | None:
        self.process.join(timeout=5)
        return self.process.exitcode

    def kill(self, process: Any = None) -> None:
        """Kill `process` (default: the current one) and reap it."""
        process = process or self.process
        if process is None:
            return
        if process.is_alive():
            process.kill()
        process.join(timeout=5)

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(timeout=10)
        self.kill()
