"""Fragmented MP4 as it is made: an init segment, then one fragment per keyframe.

`FragmentWriter` encodes like `Mp4Writer` (H.264 + AAC) but into a fragmented MP4
(`movflags=frag_keyframe+empty_moov+default_base_moof`) whose bytes go to a sink as
whole boxes: first the init segment (`ftyp` + `moov`), then each fragment (`moof` +
`mdat`) once it is complete. Every fragment starts on a keyframe the writer forces and
lasts at most its encoder profile's `fragment_seconds` (render/profiles.py: 0.5 s for
preview, 2 s for export); the first few are shorter (RAMP: 1, 2, 4, 8 frames), so the
first leaves about three frames in, not fourteen. A file of the same profile has its
keyframes at the same frames (`Mp4Writer`), so it holds the same pictures. The muxer cuts a
fragment when the next keyframe arrives (and the last one at close), so a fragment
leaves one frame after its last frame was encoded.

Audio can be given whole (`audio=`) or appended as it arrives (`append_audio`, for
live input); either way the audio under each frame is encoded right after it, so each
fragment carries the audio of its own frames. The byte stream concatenated is a
playable MP4; Media Source Extensions take the segments one by one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from pipeline.render.encode import Mp4Writer
from pipeline.render.profiles import (
    PROFILES,
    RAMP,
    STREAM_PROFILE,
    EncoderProfile,
    fragment_starts,
)
from pipeline.render.profiles import fragment_frames as _fragment_frames

FRAGMENT_SECONDS = PROFILES[STREAM_PROFILE].fragment_seconds  # a preview's fragments
MOVFLAGS = "+frag_keyframe+empty_moov+default_base_moof+skip_trailer"

Sink = Callable[[str, bytes], None]  # (kind, data): kind "init" or "fragment"
__all__ = ["RAMP", "BoxSplitter", "FragmentWriter", "fragment_frames", "fragment_starts"]


def fragment_frames(fps: float | Fraction, seconds: float = FRAGMENT_SECONDS) -> int:
    """Frames per fragment: as many as fit in `seconds` (at least one)."""
    return _fragment_frames(fps, seconds)


class BoxSplitter:
    """Cuts a byte stream into top-level ISO BMFF boxes, and groups them as segments:
    ftyp+moov is the init segment, moof+mdat a fragment; any other box is passed on
    alone (as "other")."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.buf = bytearray()
        self.pending: list[tuple[str, bytes]] = []
        self.bytes_in = 0

    def write(self, data: bytes | memoryview) -> int:
        data = bytes(data)
        self.buf += data
        self.bytes_in += len(data)
        while (box := self._next_box()) is not None:
            self._group(*box)
        return len(data)

    def _next_box(self) -> tuple[str, bytes] | None:
        if len(self.buf) < 8:
            return None
        size, kind = struct.unpack(">I4s", self.buf[:8])
        header = 8
        if size == 1:  # 64-bit size follows the type
            if len(self.buf) < 16:
                return None
            size, header = struct.unpack(">Q", self.buf[8:16])[0], 16
        if size < header:
            raise ValueError(f"MP4 box {kind!r} has a bad size {size}")
        if len(self.buf) < size:
            return None
        box = bytes(self.buf[:size])
        del self.buf[:size]
        return kind.decode("latin-1"), box

    def _group(self, kind: str, box: bytes) -> None:
        if kind in ("ftyp", "moof"):
            self.pending = [(kind, box)]
            return
        if kind == "moov" and self.pending and self.pending[0][0] == "ftyp":
            self.sink("init", self.pending[0][1] + box)
        elif kind == "mdat" and self.pending and self.pending[0][0] == "moof":
            self.sink("fragment", self.pending[0][1] + box)
        else:
            self.sink("other", box)
        self.pending = []

    def close(self) -> None:
        if self.buf or self.pending:
            raise ValueError(f"MP4 stream ended inside a box ({len(self.buf)} bytes left over)")


class _Pipe:
    """The write-only, non-seekable file object PyAV writes the container into."""

    def __init__(self, splitter: BoxSplitter) -> None:
        self.splitter = splitter

    def write(self, data: bytes) -> int:
        return self.splitter.write(data)

    def seekable(self) -> bool:
        return False

    def flush(self) -> None:
        pass


class FragmentWriter(Mp4Writer):
    """Mp4Writer into a fragmented MP4 whose segments go to `sink` as they are made.

    with FragmentWriter(sink, width, height, fps, audio=samples, sample_rate=sr) as w:
        w.write(frame)  # per frame
    # or, for live input: w.append_audio(chunk) as it arrives, before the frames it
    # covers; close() encodes what is left (and ends the audio where the video ends).

    Nothing touches the disk here: what the sink does with the bytes is its business.
    """

    def __init__(
        self,
        sink: Sink,
        width: int,
        height: int,
        fps: float | Fraction,
        audio: np.ndarray | None = None,
        sample_rate: int = 16000,
        profile: str | EncoderProfile = STREAM_PROFILE,
        live_audio: bool = False,
        audio_bitrate: int = 128_000,
    ) -> None:
        super().__init__(
            "fragmented.mp4",
            width,
            height,
            fps,
            audio=audio if audio is not None else (np.zeros(0, np.float32) if live_audio else None),
            sample_rate=sample_rate,
            profile=profile,
            audio_bitrate=audio_bitrate,
        )
        self.fragment_frames = self.profile.fragment_frames(self.fps)
        self._known_iter = self.profile.keyframes(self.fps)
        self._known = [next(self._known_iter)]  # fragment starts so far, for fragment_end
        self.splitter = BoxSplitter(sink)
        self._audio_base = 0  # samples dropped from the front of self.audio (live)
        self.live_audio = live_audio

    @property
    def bytes_out(self) -> int:
        return self.splitter.bytes_in

    def open(self) -> None:
        import av

        try:
            self._container = av.open(
                _Pipe(self.splitter), "w", format="mp4", options={"movflags": MOVFLAGS}
            )
            self._open_video()
            if self.audio is not None:
                self._open_audio()
        except BaseException:
            self.abort()
            raise

    def append_audio(self, samples: np.ndarray) -> None:
        """More audio (float32 mono at sample_rate), for frames not written yet."""
        if self.audio is None:
            raise RuntimeError("append_audio() on a FragmentWriter made without audio")
        # Keep only what is not encoded yet: memory stays at the unwritten tail.
        done = self._audio_pos - self._audio_base
        rest = self.audio[done:]
        self._audio_base = self._audio_pos
        self.audio = np.concatenate([rest, np.asarray(samples, np.float32).reshape(-1)])

    @property
    def audio_samples(self) -> int:
        """Samples of audio given so far (encoded or not)."""
        return 0 if self.audio is None else self._audio_base + self.audio.size

    def _write_audio(self, end: int) -> None:
        # `end` and self._audio_pos count from the start of the stream; self.audio holds
        # the samples from self._audio_base on.
        import av

        end = min(end, self.audio_samples)
        while self._audio_pos < end:
            stop = min(end, self._audio_pos + 4096)
            chunk = self.audio[self._audio_pos - self._audio_base : stop - self._audio_base]
            af = av.AudioFrame.from_ndarray(chunk[None, :], format="flt", layout="mono")
            af.sample_rate = self.sample_rate
            af.pts = self._audio_pos
            af.time_base = Fraction(1, self.sample_rate)
            for out in self._resampler.resample(af):
                self._container.mux(self._audio_stream.encode(out))
            self._audio_pos = stop

    def fragment_end(self, t: int) -> int:
        """The frame after the fragment that frame t falls in."""
        import bisect

        while self._known[-1] <= t:
            self._known.append(next(self._known_iter))
        return self._known[bisect.bisect_right(self._known, t)]

    def _audio_end_for(self, frames: int) -> int:
        return round(frames / self.fps * self.sample_rate)

    def close(self) -> None:
        """Flush the encoders and the last fragment to the sink."""
        if self._container is None:
            return
        try:
            if self.frames_written == 0:
                raise ValueError("no frames were written to the stream; nothing to send")
            self._container.mux(self._video.encode(None))
            if self.audio is not None:
                # The audio ends where the video does: a live stream's audio may run a
                # few samples past its last whole frame.
                self._write_audio(self._audio_end_for(self.frames_written))
                for out in self._resampler.resample(None):
                    self._container.mux(self._audio_stream.encode(out))
                self._container.mux(self._audio_stream.encode(None))
            self._close_container()
            self.splitter.close()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        try:
            self._close_container()
        except Exception:  # noqa: BLE001 - already failing
            pass
