"""Render a lip-synced MP4 from hot avatar assets and an audio file.

`render_video` reads as numbered steps. Step 4 overlaps three kinds of work on
three threads joined by small bounded queues: decoding stored frames to their I420
planes, making and blending the mouth (render/compose.py), and encoding (FFmpeg's
decoder, x264, OpenCV and NumPy release the GIL, so this uses both cores). Frames stay
in I420 from the store to the encoder; only the mouth's rectangle passes through RGB.
The queues bound memory: it does not grow with the audio length.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.assets import AvatarAssets
from pipeline.render.audio import load_audio, n_video_frames
from pipeline.render.renderers import RENDERERS
from pipeline.render.schedule import LOOP_MODES, schedule

if TYPE_CHECKING:
    from pipeline.render.encode import Mp4Writer
    from pipeline.render.renderers.base import Renderer

Progress = Callable[[int, int], None]  # (frames rendered, total frames)
# (kind, bytes): kind "init" (ftyp+moov) or "fragment" (moof+mdat); see render/fmp4.py
FragmentSink = Callable[[str, bytes], None]

# The sink `render_video` streams to when its caller passed none: set by `streaming_to`
# around a call chain that does not pass one through (lip_sync, in a stream worker).
_SINK: contextvars.ContextVar[FragmentSink | None] = contextvars.ContextVar(
    "render_sink", default=None
)


@contextlib.contextmanager
def streaming_to(sink: FragmentSink) -> Iterator[None]:
    """Within this block, render_video streams a fragmented MP4 to `sink` (and still
    writes it to its out_path, as it grows, so the file is the same bytes)."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


_DONE = object()  # end-of-stream marker on the queues
FIRST_ALONE = 8  # the first frames go to the encoder one by one (the stream's first fragments)
_POLL = 0.1  # s; how often a blocked thread looks whether it should stop


@dataclass
class RenderReport:
    out_path: Path
    backend: str
    frames: int
    fps: float  # output video rate
    audio_seconds: float
    wall_seconds: float
    first_frame_seconds: float  # from the call until the first frame reached the encoder
    profile: str = "export"  # the encoder profile (render/profiles.py)
    # seconds per stage, summed over the render's frames (`_run_pipeline`): read (stored
    # frames read and decoded), mouth (the renderer's patches), compose (the rest of
    # render/compose.py), encode (x264), mux (audio, muxer, sink); the stages run on
    # three threads, so they add up to more than the wall time when they overlap
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def render_fps(self) -> float:
        return self.frames / self.wall_seconds if self.wall_seconds > 0 else float("inf")

    @property
    def realtime_factor(self) -> float:
        """Seconds of video made per second of wall time (>= 1 is faster than real time)."""
        return self.audio_seconds / self.wall_seconds if self.wall_seconds > 0 else float("inf")


def return_freed_memory() -> None:
    """Give the memory freed by the last job back to the system (glibc's malloc_trim:
    every arena, free pages in the middle of a heap included); a render worker calls it
    after each job. glibc keeps freed multi-megabyte blocks (frames) in each render
    thread's heap for reuse, which is what a render wants (no page faults per frame) and
    what a worker rendering job after job must not keep between jobs. This replaced a
    fixed 1 MiB mmap threshold (issue 25), which returned each frame when freed and so
    faulted every new one in again: ~2300 minor faults and ~3 ms of system CPU a
    1080x1920 frame (docs/notebook/hot-path.md, "Render workers trim after each job").
    Other libcs: nothing."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def warm_up() -> None:
    """Pay once what a process's first render would: importing the render modules, cv2
    and PyAV's codecs, loading libx264 and FFmpeg's JPEG decoder (a render worker calls
    this before it says it is ready, so the first request's first fragment comes as soon
    as the second's); then return what that freed (`return_freed_memory`)."""
    import numpy as np

    from pipeline.media import decode_yuv, encode_frame
    from pipeline.mouth import phone_worker
    from pipeline.render import compose, fmp4  # noqa: F401 - imported for their cost
    from pipeline.render.renderers import warp  # noqa: F401

    phone_worker.warm()  # the phones' worker process, which whole-file renders hand pieces
    frame = decode_yuv(encode_frame(np.full((64, 64, 3), 128, np.uint8)))
    with fmp4.FragmentWriter(lambda kind, data: None, 64, 64, 25.0) as writer:
        writer.write_frame(frame)
    return_freed_memory()


def check_inputs(
    assets: AvatarAssets,
    audio_path: Path,
    out_path: Path,
    backend: str,
    loop: str,
    fps: float | None,
) -> None:
    """ValueError naming the argument, the value and the fix; nothing is decoded yet."""
    if backend not in RENDERERS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(RENDERERS)}")
    if loop not in LOOP_MODES:
        raise ValueError(f"loop={loop!r} is not one of {', '.join(LOOP_MODES)}")
    if fps is not None and not fps > 0:
        raise ValueError(f"fps={fps} must be positive (or None for the avatar's rate)")
    if assets.n_frames < 1:
        raise ValueError(f"avatar {assets.key} has no frames; precompile it again")
    check_output(out_path)


def check_output(out_path: Path) -> None:
    """ValueError unless out_path can be written (its directory exists and is writable)."""
    out_path = Path(out_path)
    parent = out_path.parent
    if not parent.is_dir():
        raise ValueError(
            f"output directory {parent} does not exist; create it or choose another -o"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"output directory {parent} is not writable; choose another -o")
    if out_path.is_dir():
        raise ValueError(f"output path {out_path} is a directory; give a file name ending in .mp4")


def render_video(
    assets: AvatarAssets,
    audio_path: str | Path,
    out_path: str | Path,
    backend: str = "warp",
    loop: str = "pingpong",
    fps: float | None = None,
    models_dir: str | Path | None = None,
    progress: Progress | None = None,
    device: str | None = None,
    vae: str | None = None,
    batch_size: int | None = None,
    sink: FragmentSink | None = None,
    cache_bytes: int | None = None,
    profile: str | None = None,
) -> RenderReport:
    """Render `assets` speaking `audio_path` into the MP4 `out_path`.

    The file appears at `out_path` only once it is complete; if anything fails (or
    `progress` raises), nothing is left behind. With a `sink` (or inside `streaming_to`)
    the output is a fragmented MP4 instead, handed to the sink segment by segment as it
    is made and written to `out_path` as it grows (removed if the render fails). Raises ValueError for bad arguments,
    AudioError for unreadable audio, ModelMissingError for missing weights. `vae`: the
    VAE that encoded the assets' latents (the recipe's); `device`, `batch_size`: see
    `load_renderer`; `cache_bytes`: decoded stored frames kept for reuse (default
    pipeline.frames.CACHE_BYTES, 0: decode every output frame's); `profile`: the encoder
    profile (render/profiles.py; None: "export" for a file, "preview" for a stream).
    """
    start = time.perf_counter()
    audio_path, out_path = Path(audio_path), Path(out_path)

    # 1. check inputs, before any decoding
    check_inputs(assets, audio_path, out_path, backend, loop, fps)
    from pipeline.render.profiles import FILE_PROFILE, STREAM_PROFILE, get_profile
    from pipeline.render.renderers import load_renderer

    sink = sink or _SINK.get()
    encoder = get_profile(profile or (STREAM_PROFILE if sink is not None else FILE_PROFILE))

    renderer = load_renderer(backend, models_dir, device, vae=vae, batch_size=batch_size)

    # 2. load the audio once, at the renderer's rate
    sr = renderer.sample_rate
    audio = load_audio(audio_path, sr)
    seconds = audio.size / sr

    # 3. schedule: which stored frame each output frame shows
    out_fps = float(fps or renderer.fps or assets.fps)
    n_out = max(1, n_video_frames(seconds, out_fps))
    idxs = schedule(n_out, assets.n_frames, loop)

    def prepare() -> None:  # the whole clip's analysis, while the first frames decode
        renderer.prepare(assets, audio, sr, n_out, out_fps)

    # 4-5. fetch -> render -> encode, overlapped; the writer muxes and closes
    if sink is not None:
        writer = _streaming_writer(out_path, sink, assets, out_fps, audio, sr, encoder)
    else:
        from pipeline.render.encode import Mp4Writer

        writer = Mp4Writer(
            out_path,
            assets.width,
            assets.height,
            out_fps,
            audio=audio,
            sample_rate=sr,
            profile=encoder,
        )
    timings: dict[str, float] = {}
    with writer:
        first = _run_pipeline(
            assets, renderer, idxs, writer, progress, cache_bytes, timings, prepare
        )
    timings.update(writer.timings)
    wall = time.perf_counter() - start
    return RenderReport(
        out_path=out_path,
        backend=backend,
        frames=n_out,
        fps=out_fps,
        audio_seconds=seconds,
        wall_seconds=wall,
        first_frame_seconds=(first - start) if first is not None else wall,
        profile=encoder.name,
        timings={k: round(v, 4) for k, v in timings.items()},
    )


def _streaming_writer(
    out_path: Path, sink: FragmentSink, assets: AvatarAssets, fps: float, audio, sr: int, profile
):
    """A FragmentWriter whose segments go to `sink` and to `out_path` (appended and
    flushed as each is made, so a reader of the file sees whole segments appear)."""
    from pipeline.render.fmp4 import FragmentWriter

    tee = _FileTee(out_path, sink)

    class _Tee(FragmentWriter):
        def open(self) -> None:
            tee.open()
            super().open()

        def close(self) -> None:
            try:
                super().close()
            finally:
                tee.close()

        def abort(self) -> None:
            super().abort()
            if tee.close():
                out_path.unlink(missing_ok=True)

    return _Tee(tee, assets.width, assets.height, fps, audio=audio, sample_rate=sr, profile=profile)


class _FileTee:
    """The sink of a streaming writer: each segment to the file, then to `sink`. It holds
    no reference to the writer: a cycle (writer -> its box splitter -> sink -> writer)
    kept each finished stream's encoder, x264's threads and buffers with it, until the
    cyclic garbage collector ran (8 threads and ~2.5 MB a stream, found by bench_load's
    soak)."""

    def __init__(self, path: Path, sink: FragmentSink) -> None:
        self.path, self.sink, self.file = path, sink, None

    def open(self) -> None:
        self.file = open(self.path, "wb")  # noqa: SIM115 - closed in close()

    def __call__(self, kind: str, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()
        self.sink(kind, data)

    def close(self) -> bool:
        """Close the file; returns whether it was open."""
        if self.file is None:
            return False
        self.file.close()
        self.file = None
        return True


class _Stop(Exception):
    """Another stage failed; this one just ends."""


def _put(q: queue.Queue, item: object, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise _Stop
        try:
            q.put(item, timeout=_POLL)
            return
        except queue.Full:
            continue


def _get(q: queue.Queue, stop: threading.Event) -> object:
    while True:
        if stop.is_set():
            raise _Stop
        try:
            return q.get(timeout=_POLL)
        except queue.Empty:
            continue


def _run_pipeline(
    assets: AvatarAssets,
    renderer: Renderer,
    idxs: np.ndarray,
    writer: Mp4Writer,
    progress: Progress | None,
    cache_bytes: int | None = None,
    timings: dict[str, float] | None = None,
    prepare: Callable[[], None] | None = None,
) -> float | None:
    """Run the three stages; returns when the first frame reached the encoder.

    Fetch decodes each stored frame to its I420 planes once per reuse
    (pipeline.frames.ScheduledFrames, `cache_bytes` of decoded frames kept); this thread
    makes the mouths and blends them into copies of those planes (render/compose.py);
    the encode thread hands them to x264. FFmpeg's decoder and x264 release the GIL.
    `timings` gets the seconds each stage took ("read", "mouth", "compose"). `prepare`
    (the renderer's, on the whole audio) runs here once the fetch thread has started, so
    the first stored frames decode on the other core meanwhile."""
    from pipeline.frames import CACHE_BYTES
    from pipeline.render.compose import compose

    cache_bytes = CACHE_BYTES if cache_bytes is None else cache_bytes
    width, height = writer.frame_size
    batch = max(1, int(renderer.batch_size))
    fetched: queue.Queue = queue.Queue(maxsize=batch + 2)
    rendered: queue.Queue = queue.Queue(maxsize=batch + 2)
    stop = threading.Event()
    errors: list[BaseException] = []
    first: list[float] = []

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except _Stop:
                pass
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                errors.append(exc)
                stop.set()

        return run

    spent = {"read": 0.0, "compose": 0.0}
    mouth = _MouthClock(renderer)

    def fetch() -> None:
        from pipeline.frames import ScheduledFrames, yuv_loader

        frames = iter(ScheduledFrames(yuv_loader(assets.load_frame), idxs, cache_bytes))
        while True:
            t0 = time.perf_counter()
            item = next(frames, _DONE)
            spent["read"] += time.perf_counter() - t0
            _put(fetched, item, stop)
            if item is _DONE:
                return

    def encode() -> None:
        while (frame := _get(rendered, stop)) is not _DONE:
            writer.write_frame(frame)
            if not first:
                first.append(time.perf_counter())

    threads = [
        threading.Thread(target=guarded(fetch), name="render-fetch", daemon=True),
        threading.Thread(target=guarded(encode), name="render-encode", daemon=True),
    ]
    for th in threads:
        th.start()
    total, done = len(idxs), 0
    try:
        if prepare is not None:
            t0 = time.perf_counter()
            prepare()
            spent["prepare"] = time.perf_counter() - t0
        ended = False
        while not ended:
            items = []
            # the first frames one at a time: each reaches the encoder (and the first
            # fragments, RAMP's 1, 2, 4 frames, the client) without waiting for the rest of
            # a batch to be made
            while len(items) < (batch if done >= FIRST_ALONE else 1):
                item = _get(fetched, stop)
                if item is _DONE:
                    ended = True
                    break
                items.append(item)
            if items:
                ts, ii, frames, owned = (list(v) for v in zip(*items, strict=True))
                t0 = time.perf_counter()
                made = compose(mouth.renderer, ts, ii, frames, width, height, owned)
                spent["compose"] += time.perf_counter() - t0
                for out in made:
                    _put(rendered, out, stop)
                done += len(items)
                if progress is not None:
                    progress(done, total)
        _put(rendered, _DONE, stop)
        threads[1].join()
    except _Stop:
        pass
    except BaseException:
        stop.set()
        raise
    finally:
        if errors or stop.is_set():
            stop.set()
        for th in threads:
            th.join()
        mouth.close()
    if errors:
        raise errors[0]
    if timings is not None:
        timings.update(read=spent["read"], mouth=mouth.seconds)
        timings["prepare"] = spent.get("prepare", 0.0)
        timings["compose"] = spent["compose"] - mouth.seconds
    return first[0] if first else None


class _MouthClock:
    """The renderer, with the time its mouth patches take counted (`seconds`), so a
    render's report can split compose into the mouth and the rest."""

    def __init__(self, renderer: Renderer) -> None:
        self.seconds = 0.0
        self.renderer = renderer
        patches = getattr(renderer, "render_patches", None)
        if patches is None:
            return

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return patches(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        renderer.render_patches = timed  # this render's renderer alone (an instance attr)

    def close(self) -> None:
        self.renderer.__dict__.pop("render_patches", None)
