"""Real talking footage with its own recorded sound, committed in testkit/footage/.

`footage_manifest.toml` beside this file lists each clip: the file, who speaks, where it
was taken from (repository, commit, path), its licence and what is known of its rights.
`clips()` lists them, `presenters()` those of one person (a presenter's footage: what a
bank is built from); `load(name)` decodes one: every video frame (RGB) and its audio as
float32 mono at the file's own rate; `write_clip` writes frames and audio back as H.264 and
AAC (a piece of a clip as a persona's `speech.mp4`).
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
MANIFEST = HERE / "footage_manifest.toml"


@dataclass(frozen=True)
class Clip:
    name: str
    file: str  # relative to testkit/
    person: str
    source: str  # "owner/repo@commit:path"
    origin: str
    licence: str
    rights: str
    sha256: str
    people: int = 1  # more: sentences of several people joined (`sentence_frames` each)
    sentence_frames: int = 0  # frames per joined sentence, where people > 1

    @property
    def path(self) -> Path:
        return HERE / self.file

    def digest(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Footage:
    """One clip decoded: frames (N, H, W, 3) uint8 RGB, audio float32 mono at `sr`."""

    clip: Clip
    frames: np.ndarray
    fps: float
    audio: np.ndarray
    sr: int

    def samples_at(self, frame: int) -> int:
        """The audio sample where video frame `frame` starts."""
        return int(round(frame / self.fps * self.sr))


@cache
def clips() -> tuple[Clip, ...]:
    data = tomllib.loads(MANIFEST.read_text())
    return tuple(Clip(**c) for c in data["clip"])


def presenters() -> tuple[Clip, ...]:
    """The clips of one person each."""
    return tuple(c for c in clips() if c.people == 1)


def clip(name: str) -> Clip:
    for c in clips():
        if c.name == name:
            return c
    raise KeyError(f"no clip {name!r} in {MANIFEST}; it lists {[c.name for c in clips()]}")


def load(name: str) -> Footage:
    """Clip `name` decoded whole (8 s at 512x512: 157 MB of frames)."""
    import av

    from pipeline.render.audio import load_audio

    c = clip(name)
    with av.open(str(c.path)) as container:
        video = container.streams.video[0]
        fps = float(video.average_rate)
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video)])
    with av.open(str(c.path)) as container:
        if not container.streams.audio:
            raise ValueError(f"{c.path} has no audio track; the manifest's clips speak")
        sr = int(container.streams.audio[0].codec_context.sample_rate)
    return Footage(c, frames, fps, load_audio(c.path, sr), sr)


X264 = {"crf": "18", "preset": "fast"}  # `write_clip`'s encoder options


def write_clip(path: Path, frames: np.ndarray, audio: np.ndarray, sr: int, fps: float) -> Path:
    """`frames` (N, H, W, 3) RGB and `audio` (float32 mono at `sr`) as H.264 + AAC: a
    persona's `speech.mp4`, or a piece of a clip cut at any frame."""
    from fractions import Fraction

    import av

    rate = Fraction(fps).limit_denominator(1001)
    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=rate, options=dict(X264))
        video.width, video.height, video.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        sound = out.add_stream("aac", rate=sr, layout="mono")
        out.start_encoding()  # both streams open before the header is written
        for k, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = k  # in 1 / rate, the encoder's time base
            out.mux(video.encode(frame))
        out.mux(video.encode())
        block = 1024  # AAC's frame size
        pcm = np.asarray(audio, np.float32)
        for start in range(0, pcm.size, block):
            chunk = pcm[None, start : start + block]
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(chunk), format="fltp", layout="mono"
            )
            frame.sample_rate, frame.pts = sr, start
            out.mux(sound.encode(frame))
        out.mux(sound.encode())
    return path
