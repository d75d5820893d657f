"""Audio for rendering: decode any common format once, and turn it into mouth openness.

`load_audio` decodes with PyAV (whatever its codecs read: WAV, MP3, M4A/AAC, FLAC,
OGG Vorbis/Opus, ...) and resamples exactly once, with `av.AudioResampler`, to the
rate the renderer asks for. `loudness_envelope` gives one value in [0, 1] per video
frame: 0 is a closed mouth (silence), 1 is the loud end of this clip's speech.
`mouth_spread` gives the mouth's shape per frame from the spectral centroid: -1 rounded
("oo": energy low in the spectrum), +1 spread ("ee": energy high), 0 neutral or silent.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

AUDIO_FORMATS = "a WAV, MP3, M4A, FLAC or OGG file"


class AudioError(ValueError):
    """The audio file is missing, unreadable, or holds no samples."""


class AudioFormatError(AudioError):
    """The file is not audio (text, an image, a video with no sound, unknown bytes): the
    HTTP service answers 415 for this, 422 for the other AudioErrors."""


def what_file_is(path: Path) -> str:
    """A few words for what a file that is not audio seems to be, from its first bytes
    (the user's mistake is usually the wrong file: a README, a photo, a silent clip)."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return "unreadable"
    images = {b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image", b"GIF8": "a GIF image"}
    for magic, name in images.items():
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    if head.startswith(b"%PDF"):
        return "a PDF document"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # a cut multi-byte character at the end is still text
            return "not in a format FFmpeg reads"
    return "a text file" if head.strip() else "blank"


def n_video_frames(seconds: float, fps: float) -> int:
    """Number of video frames for `seconds` of audio: round(seconds * fps), halves up."""
    return int(math.floor(seconds * fps + 0.5))


def load_audio(path: str | Path, sr: int) -> np.ndarray:
    """Decode `path` to float32 mono at `sr` Hz, shape (n,).

    Channels are averaged (not summed at -3 dB as libswresample's mono downmix does),
    so a stereo file with the same signal on both sides decodes to that signal.
    Raises AudioError naming the file when it is missing, not audio, or empty.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise AudioError(f"audio file {path} does not exist; pass an existing audio file")
    if sr <= 0:
        raise ValueError(f"sr={sr} must be a positive sample rate in Hz")
    chunks: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                kind = what_file_is(path)
                if "image" not in kind and container.streams.video:
                    kind = "a video with no sound"
                raise AudioFormatError(
                    f"{path} is not audio ({kind}: it has no audio stream); pass {AUDIO_FORMATS}"
                )
            stream = container.streams.audio[0]
            # Keep the source layout; we average channels ourselves (see docstring).
            resampler = av.AudioResampler(format="fltp", rate=sr)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
    except AudioError:
        raise
    except (av.error.FFmpegError, ValueError, UnicodeDecodeError) as exc:
        # FFmpeg's own text ("[Errno 1094995529] Invalid data found ...") helps no one here
        raise AudioFormatError(
            f"{path} is not audio ({what_file_is(path)}; FFmpeg cannot decode it); "
            f"pass {AUDIO_FORMATS}"
        ) from exc
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise AudioError(f"audio file {path} holds no samples; pass a non-empty audio file")
    return samples.astype(np.float32, copy=False)


def frame_rms(samples: np.ndarray, sr: int, fps: float) -> np.ndarray:
    """RMS of the samples under each video frame; frame t covers [t/fps, (t+1)/fps)."""
    n = n_video_frames(samples.size / sr, fps)
    bounds = np.minimum(np.round(np.arange(n + 1) * (sr / fps)).astype(np.int64), samples.size)
    rms = np.zeros(n, np.float32)
    for t in range(n):
        seg = samples[bounds[t] : bounds[t + 1]]
        if seg.size:
            rms[t] = math.sqrt(float(np.dot(seg, seg)) / seg.size)
    return rms


def loudness_envelope(
    samples: np.ndarray,
    sr: int,
    fps: float,
    smooth: tuple[float, float] | None = (0.015, 0.05),
    gate_db: float = -50.0,
    range_db: float = 30.0,
) -> np.ndarray:
    """Mouth openness per video frame, (T,) float32 in [0, 1], T = n_video_frames.

    Loudness is RMS in dB relative to a robust reference (the 95th percentile of the
    frames above the gate), so the mapping does not depend on recording level. Frames
    quieter than `gate_db` dBFS, or more than `range_db` below the reference, are 0
    (closed mouth). `smooth` = (attack, release) time constants in seconds of a
    one-pole follower: the mouth opens fast and closes a little slower, as it does.
    """
    rms = frame_rms(np.asarray(samples, np.float32), sr, fps)
    env = np.zeros(rms.shape, np.float32)
    with np.errstate(divide="ignore"):
        db = 20.0 * np.log10(rms)
    voiced = db > gate_db
    if not voiced.any():
        return env
    ref = float(np.percentile(db[voiced], 95))
    env[voiced] = np.clip((db[voiced] - (ref - range_db)) / range_db, 0.0, 1.0)
    if smooth is not None:
        env = _attack_release(env, fps, *smooth)
    return env


def _attack_release(x: np.ndarray, fps: float, attack: float, release: float) -> np.ndarray:
    a_up = 1.0 - math.exp(-1.0 / (fps * attack)) if attack > 0 else 1.0
    a_down = 1.0 - math.exp(-1.0 / (fps * release)) if release > 0 else 1.0
    out = np.empty_like(x)
    y = 0.0
    for i, v in enumerate(x.tolist()):
        y += (a_up if v > y else a_down) * (v - y)
        out[i] = y
    return out


CENTROID_BAND = (80.0, 6000.0)  # Hz: voice harmonics; above, hiss and sibilants dominate


def spectral_centroid(samples: np.ndarray, sr: int, fps: float) -> np.ndarray:
    """Spectral centroid (Hz) of the samples under each video frame, Hann-windowed,
    within CENTROID_BAND; 0 for a silent frame. (T,) float32, T = n_video_frames."""
    samples = np.asarray(samples, np.float32)
    n = n_video_frames(samples.size / sr, fps)
    bounds = np.minimum(np.round(np.arange(n + 1) * (sr / fps)).astype(np.int64), samples.size)
    out = np.zeros(n, np.float32)
    for t in range(n):
        seg = samples[bounds[t] : bounds[t + 1]]
        if seg.size < 8:
            continue
        mag = np.abs(np.fft.rfft(seg * np.hanning(seg.size)))
        freq = np.fft.rfftfreq(seg.size, 1.0 / sr)
        band = (freq >= CENTROID_BAND[0]) & (freq <= CENTROID_BAND[1])
        total = float(mag[band].sum())
        if total > 0:
            out[t] = float((freq[band] * mag[band]).sum()) / total
    return out


def mouth_spread(
    samples: np.ndarray,
    sr: int,
    fps: float,
    octaves: float = 0.5,
    smooth: float = 0.06,
    gate_db: float = -50.0,
) -> np.ndarray:
    """Mouth shape per video frame, (T,) float32 in [-1, 1]: -1 rounded, +1 spread.

    The centroid of each voiced frame (louder than `gate_db` dBFS) is compared with the
    clip's mean voiced centroid (geometric mean), in octaves: `octaves` below the median is fully
    rounded, as far above fully spread, so a deep and a high voice both use the whole
    range. Silent frames are 0. A one-pole smoother (`smooth` seconds, both ways) keeps
    the shape from flickering at 25 fps.
    """
    samples = np.asarray(samples, np.float32)
    centroid = spectral_centroid(samples, sr, fps)
    rms = frame_rms(samples, sr, fps)
    with np.errstate(divide="ignore"):
        voiced = (20.0 * np.log10(rms) > gate_db) & (centroid > 0)
    shape = np.zeros(centroid.shape, np.float32)
    if not voiced.any():
        return shape
    octave = np.log2(centroid[voiced])
    shape[voiced] = np.clip((octave - octave.mean()) / octaves, -1.0, 1.0)
    if smooth <= 0:
        return shape
    a = 1.0 - math.exp(-1.0 / (fps * smooth))
    out = np.empty_like(shape)
    y = float(shape[0])
    for i, v in enumerate(shape.tolist()):
        y += a * (v - y)
        out[i] = y
    return out
