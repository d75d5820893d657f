"""Streaming MP4 writer: H.264 video + AAC audio, written atomically.

Frames are encoded one at a time as they arrive (nothing is accumulated), and the
audio is interleaved with them, so memory does not grow with the length of the
video. The file is written to a temp name in the destination directory and moved
onto the final path only when `close()` succeeds; on error the temp file is removed
and whatever was at the final path is left untouched.
"""

from __future__ import annotations

import os
import time
from fractions import Fraction
from pathlib import Path
from types import TracebackType

import numpy as np

from cachestore.atomic import temp_beside
from pipeline.render.audio import resampler
from pipeline.render.profiles import FILE_PROFILE, PROFILES, EncoderProfile, get_profile

AUDIO_CHUNK = 4096  # input samples per resampler call when flushing the tail
# The export profile's x264 settings (render/profiles.py), what a file gets by default.
DEFAULT_PRESET = PROFILES[FILE_PROFILE].preset
DEFAULT_CRF = PROFILES[FILE_PROFILE].crf


def fps_fraction(fps: float | Fraction) -> Fraction:
    """Exact rate for the container: 25 -> 25/1, 29.97... -> 30000/1001."""
    if isinstance(fps, Fraction):
        return fps
    frac = Fraction(fps).limit_denominator(1001)
    if frac <= 0:
        raise ValueError(f"fps={fps} must be positive")
    return frac


def aac_rate(sr: int) -> int:
    """AAC output rate: 44100 for the 44.1 kHz family, else 48000."""
    return 44100 if sr % 11025 == 0 else 48000


class Mp4Writer:
    """Context manager writing RGB frames and float32 mono audio to an MP4.

    with Mp4Writer(path, width, height, fps, audio=samples, sample_rate=sr) as w:
        for frame in frames:
            w.write(frame)  # (height, width, 3) uint8 RGB

    Odd sizes are cropped by one pixel to even (yuv420p needs even sizes). Audio up
    to the end of each written frame is encoded along with it; the rest of the audio
    is flushed at close, so the file's duration is the audio's. `profile` names the
    encoder settings (render/profiles.py: "export" unless told).

    `timings` adds up, in seconds, the time this writer's calls spent in x264
    ("encode") and in the audio encoder, the muxer and the sink ("mux").
    """

    def __init__(
        self,
        path: str | Path,
        width: int,
        height: int,
        fps: float | Fraction,
        audio: np.ndarray | None = None,
        sample_rate: int = 16000,
        profile: str | EncoderProfile = FILE_PROFILE,
        audio_bitrate: int = 128_000,
    ) -> None:
        self.path = Path(path)
        self.width, self.height = int(width), int(height)
        if self.width < 2 or self.height < 2:
            raise ValueError(f"video size {width}x{height} is too small; need at least 2x2")
        self.fps = fps_fraction(fps)
        self.audio = None if audio is None else np.asarray(audio, np.float32).reshape(-1)
        self.sample_rate = int(sample_rate)
        self.profile = get_profile(profile)
        self.audio_bitrate = audio_bitrate
        self.timings = {"encode": 0.0, "mux": 0.0}
        self.frames_written = 0
        self._container = None
        self._video = self._audio_stream = self._resampler = None  # while open
        self._tmp: Path | None = None
        self._audio_pos = 0  # input samples already handed to the resampler

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> Mp4Writer:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def open(self) -> None:
        import av

        parent = self.path.parent
        if not parent.is_dir():
            raise ValueError(f"output directory {parent} does not exist; create it first")
        self._tmp = temp_beside(self.path, suffix=".mp4")
        try:
            self._container = av.open(
                str(self._tmp), "w", format="mp4", options={"movflags": "+faststart"}
            )
            self._open_video()
            if self.audio is not None:
                self._open_audio()
        except BaseException:
            self.abort()
            raise

    def _open_video(self) -> None:
        self._w, self._h = self.width - self.width % 2, self.height - self.height % 2
        v = self._container.add_stream("libx264", rate=self.fps)
        v.width, v.height, v.pix_fmt = self._w, self._h, "yuv420p"
        v.options = self.profile.x264_options(self.fps)
        self._keyframes = self.profile.keyframes(self.fps)
        self._next_key = next(self._keyframes)
        # Frames are converted with OpenCV's BT.601 limited-range matrix; say so, or
        # players guess BT.709 for HD and shift the colours.
        cc = v.codec_context
        cc.color_range, cc.colorspace, cc.color_primaries, cc.color_trc = 1, 6, 6, 6
        self._video = v

    def _open_audio(self) -> None:

        rate = aac_rate(self.sample_rate)
        a = self._container.add_stream("aac", rate=rate, layout="mono")
        a.bit_rate = self.audio_bitrate
        self._audio_stream = a
        self._resampler = resampler("fltp", "mono", rate)

    def write(self, frame: np.ndarray) -> None:
        """Encode one (height, width, 3) uint8 RGB frame, and the audio under it."""
        from pipeline.yuv import frame_from_rgb

        if frame.shape != (self.height, self.width, 3) or frame.dtype != np.uint8:
            raise ValueError(
                f"frame {frame.shape} {frame.dtype} does not match the video: "
                f"expected ({self.height}, {self.width}, 3) uint8 RGB"
            )
        self.write_frame(frame_from_rgb(frame[: self._h, : self._w]))

    def write_yuv(self, yuv: np.ndarray) -> None:
        """Encode one frame given as I420 planes, (h * 3 / 2, w) uint8 (BT.601 limited
        range, as cv2.COLOR_RGB2YUV_I420 makes them), and the audio under it."""
        import av

        if yuv.shape != (self._h * 3 // 2, self._w) or yuv.dtype != np.uint8:
            raise ValueError(
                f"I420 frame {yuv.shape} {yuv.dtype} does not match the video: "
                f"expected ({self._h * 3 // 2}, {self._w}) uint8"
            )
        self.write_frame(av.VideoFrame.from_ndarray(yuv, format="yuv420p"))

    @property
    def frame_size(self) -> tuple[int, int]:
        """(width, height) of the frames `write_frame` takes: the video's, cropped to even."""
        return self._w, self._h

    def write_frame(self, vf) -> None:
        """Encode one I420 `av.VideoFrame` (yuv420p, BT.601 limited range, `frame_size`;
        pipeline/yuv.py) and the audio under it. The frame is not kept: x264 copies it,
        so a frame shown again may be written again."""
        from av.video.frame import PictureType

        if self._container is None:
            raise RuntimeError("Mp4Writer.write() called outside `with` / before open()")
        if (vf.width, vf.height) != (self._w, self._h) or vf.format.name != "yuv420p":
            raise ValueError(
                f"frame {vf.width}x{vf.height} {vf.format.name} does not match the video: "
                f"expected {self._w}x{self._h} yuv420p"
            )
        vf.pts = self.frames_written
        vf.time_base = 1 / self.fps
        # the profile places keyframes (libx264 makes a forced I an IDR, closed GOP); a
        # shared frame shown again must not carry the last one's type
        key = self.frames_written == self._next_key
        if key:
            self._next_key = next(self._keyframes)
        vf.pict_type = PictureType.I if key else PictureType.NONE
        t0 = time.perf_counter()
        packets = self._video.encode(vf)
        t1 = time.perf_counter()
        self._mux_video(packets)
        self.frames_written += 1
        if self.audio is not None:
            self._write_audio(round(self.frames_written / self.fps * self.sample_rate))
        self.timings["encode"] += t1 - t0
        self.timings["mux"] += time.perf_counter() - t1

    def _mux_video(self, packets) -> None:
        # Each frame lasts one frame: said on the packet, so a muxer that writes a
        # packet before the next one arrives (a fragment per frame) need not guess it.
        for packet in packets:
            packet.duration = 1  # in the codec's time base, 1/fps
        self._container.mux(packets)

    def _write_audio(self, end: int) -> None:
        import av

        end = min(end, self.audio.size)
        while self._audio_pos < end:
            stop = min(end, self._audio_pos + AUDIO_CHUNK)
            chunk = self.audio[self._audio_pos : stop]
            af = av.AudioFrame.from_ndarray(chunk[None, :], format="flt", layout="mono")
            af.sample_rate = self.sample_rate
            af.pts = self._audio_pos
            af.time_base = Fraction(1, self.sample_rate)
            for out in self._resampler.resample(af):
                self._container.mux(self._audio_stream.encode(out))
            self._audio_pos = stop

    def close(self) -> None:
        """Flush both encoders, finish the file and move it onto the final path."""
        if self._container is None:
            return
        try:
            if self.frames_written == 0:
                raise ValueError(f"no frames were written to {self.path}; nothing to save")
            t0 = time.perf_counter()
            packets = self._video.encode(None)
            self.timings["encode"] += time.perf_counter() - t0
            self._mux_video(packets)
            if self.audio is not None:
                self._write_audio(self.audio.size)
                for out in self._resampler.resample(None):
                    self._container.mux(self._audio_stream.encode(out))
                self._container.mux(self._audio_stream.encode(None))
            self._close_container()
            os.replace(self._tmp, self.path)
            self._tmp = None
        except BaseException:
            self.abort()
            raise

    def _close_container(self) -> None:
        """Close the container and let go of its streams and the resampler here: their
        encoders (x264's threads and ~2.5 MB each stream) are freed now, as the last
        reference goes, not whenever the garbage collector reaches this writer (a writer
        may be kept, or be in a cycle, long after its stream ended)."""
        container, self._container = self._container, None
        self._video = self._audio_stream = self._resampler = None
        if container is not None:
            container.close()  # drops its streams first, even if the trailer fails

    def abort(self) -> None:
        """Drop the temp file; the final path is left as it was."""
        try:
            self._close_container()
        except Exception:  # noqa: BLE001 - already failing; the temp goes anyway
            pass
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None
