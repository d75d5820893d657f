"""Deterministic test data: presenter loops made from the astronaut photograph.

The photo (``skimage.data.astronaut()``, a real face) is scaled to presenter size and
moved by a known affine per frame, so every frame has a ground-truth face box. Tests,
``just demo`` and the benchmarks use these instead of shipped media.

Sizes are (width, height); frames are numpy RGB uint8 (height, width, 3).
"""

from __future__ import annotations

import math
import wave
from collections.abc import Iterable, Iterator
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import numpy as np

# dlib HOG's top detection on the 512x512 photo at upsample 1 (measured once, x2/y2
# exclusive). A fixed box keeps truth independent of the detector under test.
SOURCE_FACE_BOX = (175.0, 76.0, 266.0, 167.0)
FACE_WIDTH_FRACTION = 0.30  # face box width / shorter frame side: a presenter close-up
FACE_CENTRE = (0.5, 0.37)  # where the face centre rests, as fractions of (width, height)
MOTIONS = ("gentle", "jump", "still")
JUMP_PROFILE = (0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5)  # x offset in face widths, per frame
JUMP_SIZE = 0.85  # face widths; keeps a centred 1080-wide face inside the frame


@lru_cache(maxsize=1)
def _astronaut() -> np.ndarray:
    try:
        from skimage import data
    except ImportError:  # not in the core install: the demo and the tests only
        raise RuntimeError(
            "the demo's astronaut photo comes with scikit-image, in hotplate's demo extra: "
            "pip install 'hotplate[demo]' (`just demo` installs it)"
        ) from None

    return np.ascontiguousarray(data.astronaut())


PLATE_SMOOTH = 0.08  # the backdrop's extension beyond the photo: blur width, x frame width


def _jump_start(n_frames: int, stride: int = 4) -> int:
    """First jump frame: a third into the loop, just after a stride-4 keyframe."""
    return stride * (n_frames // (3 * stride)) + 1


def loop_params(
    n_frames: int, size: tuple[int, int] = (1080, 1920), motion: str = "gentle", seed: int = 0
) -> np.ndarray:
    """Per-frame motion as (N, 4) float64 rows: centre x, centre y, scale, angle (deg).

    Every term is periodic in N-1 frames, so frame 0 equals frame N-1 (a seamless loop).
    """
    if motion not in MOTIONS:
        raise ValueError(f"motion={motion!r} is not one of {', '.join(MOTIONS)}")
    if n_frames < 1:
        raise ValueError(f"n_frames={n_frames} must be >= 1")
    width, height = size
    rng = np.random.default_rng(seed)
    face_w = FACE_WIDTH_FRACTION * min(width, height)
    base_scale = face_w / (SOURCE_FACE_BOX[2] - SOURCE_FACE_BOX[0])
    t = np.arange(n_frames, dtype=np.float64)
    period = max(n_frames - 1, 1)
    phase = 2.0 * math.pi * (t % period) / period
    p1, p2, p3 = rng.uniform(0.0, 2.0 * math.pi, 3) if motion != "still" else (0.0, 0.0, 0.0)
    amp = 0.0 if motion == "still" else 1.0
    # Sway, a slight bob, breathing and a small head turn, as a presenter does.
    cx = width * FACE_CENTRE[0] + amp * face_w * (
        0.12 * np.sin(phase + p1) + 0.03 * np.sin(3 * phase + p2)
    )
    cy = height * FACE_CENTRE[1] + amp * face_w * 0.04 * np.sin(2 * phase + p3)
    scale = base_scale * (1.0 + amp * 0.025 * np.sin(2 * phase + p2))
    angle = amp * 3.0 * np.sin(phase + p3)
    if motion == "jump" and n_frames >= 16:
        start = _jump_start(n_frames)
        profile = np.asarray(JUMP_PROFILE) * JUMP_SIZE * face_w
        cx[start : start + len(profile)] += profile[: n_frames - start]
    return np.stack([cx, cy, scale, angle], axis=1)


def _affine(row: np.ndarray) -> np.ndarray:
    """2x3 matrix taking photo pixels to frame pixels for one row of loop_params."""
    cx, cy, scale, angle = row
    sx, sy = (
        (SOURCE_FACE_BOX[0] + SOURCE_FACE_BOX[2]) / 2,
        (SOURCE_FACE_BOX[1] + SOURCE_FACE_BOX[3]) / 2,
    )
    a = math.radians(angle)
    c, s = scale * math.cos(a), scale * math.sin(a)
    # Rotate and scale about the photo's face centre, then put that centre at (cx, cy).
    return np.array([[c, s, cx - c * sx - s * sy], [-s, c, cy + s * sx - c * sy]], np.float64)


def truth_boxes(params: np.ndarray) -> np.ndarray:
    """Ground-truth face boxes (N, 4) float32: the photo's face box through each affine.

    The box keeps its centre and scales with the frame's scale; a detector reports an
    upright box for a slightly turned face, so rotation does not widen it.
    """
    w = SOURCE_FACE_BOX[2] - SOURCE_FACE_BOX[0]
    h = SOURCE_FACE_BOX[3] - SOURCE_FACE_BOX[1]
    cx, cy, scale = params[:, 0], params[:, 1], params[:, 2]
    half_w, half_h = w * scale / 2, h * scale / 2
    return np.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], 1).astype(np.float32)


def render_frame(row: np.ndarray, size: tuple[int, int] = (1080, 1920)) -> np.ndarray:
    """One frame: the photo warped to fill the frame, as a studio plate would.

    At presenter size the photo falls short of the frame's top (about its top eighth). Its
    edge rows there are the studio backdrop, so they are carried on upward and smoothed
    across, fading in: a backdrop that goes on, with no flat band and no hard line."""
    import cv2

    width, height = size
    photo = _astronaut()
    warp = _affine(row)
    frame = cv2.warpAffine(
        photo, warp, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    inside = cv2.warpAffine(
        np.full(photo.shape[:2], 255, np.uint8), warp, (width, height), flags=cv2.INTER_LINEAR
    )
    if inside.min() == 255:
        return frame
    k = max(3, int(PLATE_SMOOTH * width) | 1)
    # the carried-on rows are streaks of the edge's pixels: smoothed across, and blended in
    # over k pixels from the photo's edge so the seam does not show
    smooth = cv2.blur(frame, (k, 1))
    outside = cv2.blur(255 - inside, (1, k)).astype(np.float32)[..., None] / 255.0
    outside = np.maximum(outside, (255 - inside).astype(np.float32)[..., None] / 255.0)
    return (frame * (1.0 - outside) + smooth * outside).astype(np.uint8)


def iter_loop_frames(
    n_frames: int = 150,
    size: tuple[int, int] = (1080, 1920),
    motion: str = "gentle",
    seed: int = 0,
) -> Iterator[np.ndarray]:
    """The loop's frames one at a time, so long loops need not sit in memory."""
    for row in loop_params(n_frames, size, motion, seed):
        yield render_frame(row, size)


def make_loop_frames(
    n_frames: int = 150,
    size: tuple[int, int] = (1080, 1920),
    motion: str = "gentle",
    seed: int = 0,
) -> tuple[list[np.ndarray], np.ndarray]:
    """A presenter loop and its ground-truth face boxes (N, 4) float32.

    motion: "gentle" (sway, breathing, a small turn), "jump" (gentle plus one fast move
    of ~0.85 face width over a frame, held five frames, then back), or "still".
    Note 150 full-HD portrait frames take ~0.9 GB; use `iter_loop_frames` for more.
    """
    params = loop_params(n_frames, size, motion, seed)
    return [render_frame(row, size) for row in params], truth_boxes(params)


def jump_frames(n_frames: int) -> range:
    """The frames of motion="jump" where the face is away from its resting place."""
    start = _jump_start(n_frames)
    return range(start, min(n_frames, start + len(JUMP_PROFILE)))


def write_loop_video(
    path: str | Path,
    frames: Iterable[np.ndarray] | None = None,
    fps: float = 25,
    *,
    crf: int = 18,
    preset: str = "veryfast",
    **params: object,
) -> Path:
    """Write frames (or a loop made from `params` for iter_loop_frames) as H.264 yuv420p MP4."""
    import av

    path = Path(path)
    if frames is None:
        frames = iter_loop_frames(**params)  # type: ignore[arg-type]
    it = iter(frames)
    first = next(it, None)
    if first is None:
        raise ValueError(f"write_loop_video({path}): no frames to write")
    height, width = first.shape[:2]
    # The container comes from the name; a temporary name (loop.mp4.part) is still MP4.
    known = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska"}
    if ".webm" in (s.lower() for s in path.suffixes):
        raise ValueError(f"write_loop_video({path}): writes H.264; name it .mp4, .mov or .mkv")
    fmt = next((known[s.lower()] for s in reversed(path.suffixes) if s.lower() in known), "mp4")
    with av.open(str(path), mode="w", format=fmt) as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = width - width % 2, height - height % 2
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": preset}
        for frame in _chain(first, it):
            even = np.ascontiguousarray(frame[: stream.height, : stream.width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(even, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _chain(first: np.ndarray, rest: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    yield first
    yield from rest


def write_still(
    path: str | Path, size: tuple[int, int] = (1080, 1920), seed: int = 0, quality: int = 95
) -> np.ndarray:
    """Write the loop's first frame as an image (format from the suffix); return its truth box."""
    import cv2

    params = loop_params(1, size, "gentle", seed)
    frame = render_frame(params[0], size)
    path = Path(path)
    flags = [cv2.IMWRITE_JPEG_QUALITY, quality] if path.suffix.lower() in (".jpg", ".jpeg") else []
    if not cv2.imwrite(str(path), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), flags):
        raise ValueError(f"write_still({path}): OpenCV cannot write this format; use .png or .jpg")
    return truth_boxes(params)[0]


def make_speech_audio(seconds: float, sr: int = 16000, seed: int = 0) -> np.ndarray:
    """A speech-like mono signal in [-1, 1]: voiced syllables with formants, and pauses.

    Syllables last 100-250 ms with a rise-fall envelope and a gliding pitch; formant
    peaks weight the harmonics like vowels do; short gaps separate syllables and longer
    ones separate phrases, so a loudness-driven mouth opens and closes.
    """
    rng = np.random.default_rng(seed)
    n_total = int(round(seconds * sr))
    out = np.zeros(n_total, np.float32)
    pos = int(rng.uniform(0.05, 0.15) * sr)
    vowels = ((730, 1090, 2440), (270, 2290, 3010), (530, 1840, 2480), (570, 840, 2410))
    while pos < n_total:
        n = int(rng.uniform(0.10, 0.25) * sr)
        t = np.arange(n) / sr
        f0 = rng.uniform(110, 210) * (1 + rng.uniform(-0.15, 0.15) * t / t[-1])
        phase = 2 * np.pi * np.cumsum(f0) / sr
        harmonics = np.arange(1, int(3800 / f0.max()) + 1)
        formants = vowels[rng.integers(len(vowels))]
        freq = harmonics * f0.mean()
        gain = sum(np.exp(-(((freq - f) / (0.12 * f + 60)) ** 2)) for f in formants) + 0.02
        tone = (gain[:, None] / harmonics[:, None] * np.sin(harmonics[:, None] * phase)).sum(0)
        envelope = np.sin(np.pi * np.linspace(0, 1, n)) ** 1.5
        syllable = tone * envelope * rng.uniform(0.6, 1.0)
        end = min(n_total, pos + n)
        out[pos:end] += syllable[: end - pos].astype(np.float32)
        gap = rng.uniform(0.3, 0.6) if rng.random() < 0.2 else rng.uniform(0.04, 0.12)
        pos = end + int(gap * sr)
    peak = float(np.abs(out).max())
    return out * (0.6 / peak) if peak > 0 else out


def write_wav(path: str | Path, samples: np.ndarray, sr: int = 16000) -> Path:
    """Write float samples in [-1, 1] ((N,) mono or (N, C)) as 16-bit PCM WAV."""
    path = Path(path)
    data = np.asarray(samples, np.float32)
    channels = 1 if data.ndim == 1 else data.shape[1]
    pcm = (np.clip(data, -1.0, 1.0) * 32767).round().astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())
    return path
