"""Live lip-sync: audio that arrives as it is spoken in, fragmented MP4 out.

`pipeline.lip_sync.live_lip_sync` takes lip_sync's steps (resolve the names, lease the
avatar, precompile just in time on a miss), then `live_render` here turns a stream of
PCM chunks into fragments:

1. each chunk (s16le, any size, any channel count) becomes float32 mono at the
   renderer's rate (one streaming resampler, so chunk edges leave no clicks);
2. as soon as the audio covers more frames plus the renderer's lookahead, those
   frames are rendered (a fragment is complete, and sent, once the first frame of the
   next one is encoded): the renderer is prepared on a window of the audio
   (CONTEXT_SECONDS before the fragment, its lookahead after), so what a frame shows
   depends on nearby audio only, as a whole-file render's does up to the loudness
   reference (the window's, not the whole clip's);
3. each frame and the audio under it go to a `FragmentWriter`, whose segments go to
   the sink; at the end of the input the last, shorter fragment is flushed.

Memory: the audio kept is the window (CONTEXT_SECONDS) plus what is not rendered yet.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.render.audio import n_video_frames, resampler
from pipeline.render.video import _DONE, FragmentSink, _get, _put, _Stop

CONTEXT_SECONDS = 4.0  # audio before a fragment its renderer sees (loudness reference)
LOOKAHEAD = {"warp": 1, "musetalk": 2}  # frames past a fragment its frames depend on
MIN_BATCH = 4  # frames rendered per look at the input, unless a fragment completes sooner
FORMATS = ("s16le",)
MAX_SECONDS = 3600.0  # one take; the server's own audio limit is lower
Progress = Callable[[str, int, int], None]


@dataclass
class LiveReport:
    frames: int = 0
    fragments: int = 0
    audio_seconds: float = 0.0
    fps: float = 0.0
    avatar: str = ""
    jit: bool = False
    jit_seconds: float = 0.0
    first_fragment_seconds: float | None = None  # from the first audio to fragment 1
    end_lag_seconds: float | None = None  # from the end of the input to the last byte
    timings: dict = field(default_factory=dict)  # stage -> seconds (prepare, render, encode)


class PcmDecoder:
    """s16le interleaved bytes at (rate, channels) -> float32 mono at `out_rate`."""

    def __init__(self, rate: int, channels: int, out_rate: int) -> None:

        self.rate, self.channels, self.out_rate = rate, channels, out_rate
        self.carry = b""  # an incomplete sample frame left from the last chunk
        self.pts = 0
        self.resampler = resampler("flt", "mono", out_rate)

    def feed(self, data: bytes | None) -> np.ndarray:
        """Samples for `data`; None flushes the resampler (end of the input)."""
        import av

        if data is None:
            frames = self.resampler.resample(None)
        else:
            data = self.carry + bytes(data)
            whole = len(data) - len(data) % (2 * self.channels)
            self.carry = data[whole:]
            if whole == 0:
                return np.zeros(0, np.float32)
            pcm = np.frombuffer(data[:whole], "<i2").reshape(-1, self.channels)
            mono = (pcm.astype(np.float32).mean(axis=1) / 32768.0).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(mono[None, :], format="flt", layout="mono")
            frame.sample_rate, frame.pts = self.rate, self.pts
            self.pts += mono.size
            frames = self.resampler.resample(frame)
        out = [f.to_ndarray().reshape(-1) for f in frames]
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


def live_render(
    assets,
    chunks: Iterable[bytes],
    rate: int,
    channels: int,
    sink: FragmentSink,
    backend: str = "warp",
    loop: str = "pingpong",
    fps: float | None = None,
    models_dir: str | Path | None = None,
    device: str | None = None,
    vae: str | None = None,
    batch_size: int | None = None,
    progress: Progress | None = None,
    max_seconds: float = MAX_SECONDS,
    profile: str | None = None,
) -> LiveReport:
    """Render PCM `chunks` (an iterable that blocks until more arrives and ends with the
    input) into fragments handed to `sink` as soon as their audio is in.

    Three threads, as in render_video: stored frames are decoded ahead (their order is
    known before the audio is), this thread reads the input and renders, and one thread
    encodes; the queues between them are small, so memory does not grow with the input.
    `profile`: the encoder profile (render/profiles.py; None: "preview")."""
    from pipeline.render.compose import compose
    from pipeline.render.fmp4 import FragmentWriter
    from pipeline.render.renderers import load_renderer
    from pipeline.render.schedule import schedule

    renderer = load_renderer(backend, models_dir, device, vae=vae, batch_size=batch_size)
    sr = renderer.sample_rate
    out_fps = float(fps or renderer.fps or assets.fps)
    look = LOOKAHEAD.get(backend, 2)
    if hasattr(renderer, "lookahead"):  # a renderer that can look further (whole files)
        renderer.lookahead = look  # sees only what live has
    context = int(round(CONTEXT_SECONDS * out_fps))
    decoder = PcmDecoder(rate, channels, sr)
    report = LiveReport(fps=out_fps)
    timings = {"prepare": 0.0, "render": 0.0}
    first_audio: list[float] = []
    emitted: list[float] = []

    def counted(kind: str, data: bytes) -> None:
        if kind == "fragment":
            report.fragments += 1
            emitted.append(time.perf_counter())
        sink(kind, data)

    from pipeline.render.profiles import STREAM_PROFILE

    writer = FragmentWriter(
        counted,
        assets.width,
        assets.height,
        out_fps,
        sample_rate=sr,
        live_audio=True,
        profile=profile or STREAM_PROFILE,
    )
    limit = int(max_seconds * out_fps) + 1
    pipe = _Pipeline(assets, schedule(limit, assets.n_frames, loop), writer)
    kept = np.zeros(0, np.float32)  # audio from sample `kept_from` on
    kept_from = 0
    done = 0  # frames rendered

    def frame_end(t: int) -> int:  # samples up to the end of frame t - 1
        return int(round(t * sr / out_fps))

    def render_upto(stop: int, total: int) -> None:
        """Frames done..stop-1, the renderer prepared on their window of the audio."""
        nonlocal done
        if stop <= done:
            return
        w0 = max(0, done - context)
        w1 = min(stop + look, total)
        window = kept[frame_end(w0) - kept_from : frame_end(w1) - kept_from]
        t0 = time.perf_counter()
        renderer.prepare(assets, window, sr, w1 - w0, out_fps)
        t1 = time.perf_counter()
        batch = max(1, int(renderer.batch_size))
        while done < stop:
            size = batch if done else 1  # the first frame alone, as render_video does
            items = [pipe.frame() for _ in range(done, min(stop, done + size))]
            ts = [t - w0 for t, _, _, _ in items]
            idxs = [i for _, i, _, _ in items]
            frames = [f for _, _, f, _ in items]
            owned = [o for _, _, _, o in items]
            for frame in compose(renderer, ts, idxs, frames, *writer.frame_size, owned):
                pipe.encode(("frame", frame))
            done += len(items)
        timings["prepare"] += t1 - t0
        timings["render"] += time.perf_counter() - t1
        if progress is not None:
            progress("render", done, 0)

    with writer, pipe:
        for chunk in chunks:
            if not chunk:
                continue
            if not first_audio:
                first_audio.append(time.perf_counter())
            samples = decoder.feed(chunk)
            kept = np.concatenate([kept, samples])
            pipe.encode(("audio", samples))
            have = kept_from + kept.size
            if have > max_seconds * sr:
                raise ValueError(
                    f"live input over {max_seconds:g} s; end the take and start another"
                )
            # Frames whose audio (and lookahead) is in go now, not a fragment at a time:
            # a fragment leaves the muxer when the next one's first frame is encoded.
            # Each call prepares the renderer on a window of CONTEXT_SECONDS, so frames go
            # in batches of MIN_BATCH, or as soon as one completes a fragment.
            ready = int(have * out_fps / sr) - look
            if ready >= done + MIN_BATCH or ready > writer.fragment_end(done):
                render_upto(ready, ready + look)
                # drop audio the next windows will not read
                keep_from = frame_end(max(0, done - context))
                if keep_from > kept_from:
                    kept = kept[keep_from - kept_from :]
                    kept_from = keep_from
        ended = time.perf_counter()
        tail = decoder.feed(None)
        kept = np.concatenate([kept, tail])
        pipe.encode(("audio", tail))
        have = kept_from + kept.size
        if have == 0:
            raise ValueError("the live input ended before any audio arrived; send PCM first")
        total = max(1, n_video_frames(have / sr, out_fps))
        render_upto(total, total)
        pipe.finish()
    report.end_lag_seconds = time.perf_counter() - ended
    report.frames = done
    report.audio_seconds = have / sr
    if first_audio and emitted:
        report.first_fragment_seconds = emitted[0] - first_audio[0]
    report.timings = {k: round(v, 3) for k, v in timings.items()}
    return report


class _Pipeline:
    """The fetch thread (stored frames decoded ahead, in schedule order) and the encode
    thread (audio and frames to the writer, in the order given)."""

    def __init__(self, assets, idxs: np.ndarray, writer) -> None:
        self.assets, self.idxs, self.writer = assets, idxs, writer
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.fetched: queue.Queue = queue.Queue(maxsize=6)
        self.encoding: queue.Queue = queue.Queue(maxsize=64)
        self.threads = [
            threading.Thread(target=self._guard(self._fetch), name="live-fetch", daemon=True),
            threading.Thread(target=self._guard(self._encode), name="live-encode", daemon=True),
        ]

    def __enter__(self) -> _Pipeline:
        for th in self.threads:
            th.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for th in self.threads:
            th.join()
        if self.errors and exc[0] is None:
            raise self.errors[0]

    def _guard(self, fn):
        def run() -> None:
            try:
                fn()
            except _Stop:
                pass
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                self.errors.append(exc)
                self.stop.set()

        return run

    def _fetch(self) -> None:
        from pipeline.frames import ScheduledFrames, yuv_loader

        for item in ScheduledFrames(yuv_loader(self.assets.load_frame), self.idxs):
            _put(self.fetched, item, self.stop)

    def _encode(self) -> None:
        while (item := _get(self.encoding, self.stop)) is not _DONE:
            kind, value = item
            if kind == "audio":
                self.writer.append_audio(value)
            else:
                self.writer.write_frame(value)

    def _check(self) -> None:
        if self.errors:
            raise self.errors[0]

    def frame(self) -> tuple:
        try:
            return _get(self.fetched, self.stop)
        except _Stop:
            self._check()
            raise

    def encode(self, item) -> None:
        try:
            _put(self.encoding, item, self.stop)
        except _Stop:
            self._check()
            raise

    def finish(self) -> None:
        """Wait until everything given to encode() is written."""
        self.encode(_DONE)
        self.threads[1].join()
        self._check()
