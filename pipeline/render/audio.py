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
            to_sr = resampler("fltp", None, sr)
            for frame in container.decode(stream):
                for out in to_sr.resample(frame):
                    chunks.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
            for out in to_sr.resample(None):
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


def resampler(format: str, layout: str | None, rate: int):
    """An `av.AudioResampler` to `format`, `layout` (None: the input's) and `rate` that
    starts no thread: every resampler here goes through this.

    Its filter graph would start a pool of idle threads, one per CPU, for a filter
    (aresample) that runs on one. Since PyAV 18.1.1 the graph and its filters refer to
    each other, so only the cyclic garbage collector frees the graph and stops those
    threads: with the collector off, a streamed render left four threads behind on a
    4-CPU machine (tests/pipeline/test_stream_render.py). PyAV before 18.1.1 has no
    `threads` argument, and frees the graph with the resampler."""
    import av

    kw = {"format": format, "layout": layout, "rate": rate}
    try:
        return av.AudioResampler(**kw, threads=1)
    except TypeError:  # PyAV < 18.1.1
        return av.AudioResampler(**kw)


def frame_bounds(n_samples: int, sr: int, fps: float) -> np.ndarray:
    """(T + 1,) sample index where each video frame starts (and the last one ends):
    frame t covers [t/fps, (t+1)/fps)."""
    n = n_video_frames(n_samples / sr, fps)
    return np.minimum(np.round(np.arange(n + 1) * (sr / fps)).astype(np.int64), n_samples)


class _LastOf:
    """The last few results of an analysis of a whole clip, by (the samples array
    itself, sr, fps): a render's prepare asks for the same clip's spectra and RMS from
    the mouth drive, the bank's features and the silence rests (2 and 4 times for a
    20 s clip, ~40% of prepare). The array is held by weak reference and compared by
    identity, so another clip, or the same one sliced, is analysed anew; results are
    read-only, so no caller can change another's."""

    def __init__(self, fn, size: int = 4) -> None:
        self.fn, self.size, self.kept = fn, size, []

    def __call__(self, samples: np.ndarray, sr: int, fps: float):
        import weakref

        for ref, key, out in self.kept:
            if ref() is samples and key == (samples.size, sr, fps):
                return out
        out = self.fn(samples, sr, fps)
        for a in out if isinstance(out, tuple) else (out,):
            a.flags.writeable = False
        try:
            ref = weakref.ref(samples)
        except TypeError:  # not an ndarray of its own: nothing to key on
            return out
        self.kept = [k for k in self.kept if k[0]() is not None][-(self.size - 1) :]
        self.kept.append((ref, (samples.size, sr, fps), out))
        return out


def frame_rms(samples: np.ndarray, sr: int, fps: float) -> np.ndarray:
    """RMS of the samples under each video frame; frame t covers [t/fps, (t+1)/fps).
    Read-only (the last results are shared: `_LastOf`)."""
    samples = np.asarray(samples, np.float32)
    return _frame_rms(samples, sr, fps)


def _rms(samples: np.ndarray, sr: int, fps: float) -> np.ndarray:
    bounds = frame_bounds(samples.size, sr, fps)
    energy = np.concatenate([[0.0], np.cumsum(samples.astype(np.float64) ** 2)])
    counts = np.diff(bounds)
    sums = energy[bounds[1:]] - energy[bounds[:-1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.where(counts > 0, np.sqrt(np.maximum(sums, 0.0) / np.maximum(counts, 1)), 0.0)
    return rms.astype(np.float32)


_frame_rms = _LastOf(_rms)


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
    (closed mouth). `smooth` = (attack, release) time constants in seconds: the mouth
    opens fast and closes a little slower, as it does (`attack_release`).
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
        env = attack_release(env, fps, *smooth)
    return env


def one_pole(x: np.ndarray, fps: float, tau: float, reverse: bool = False) -> np.ndarray:
    """A one-pole low-pass (time constant `tau` seconds) over frames, as a convolution
    with its impulse response cut where it falls under 1e-4: no loop over frames. The
    start is held at x[0] (the filter's state starts there). `reverse` runs it backwards
    in time (a look-ahead: each frame sees the ones after it)."""
    x = np.asarray(x, np.float32)
    if tau <= 0 or x.size == 0:
        return x.copy()
    a = 1.0 - math.exp(-1.0 / (fps * tau))
    n = max(1, min(x.size, int(math.ceil(math.log(1e-4) / math.log(1.0 - a))) + 1))
    kernel = a * (1.0 - a) ** np.arange(n)
    src = x[::-1] if reverse else x
    padded = np.concatenate([np.full(n - 1, src[0], np.float32), src])
    # the first output equals the first input (state starts there), as the recursion had
    out = np.convolve(padded, kernel / kernel.sum(), mode="valid")[: x.size].astype(np.float32)
    return out[::-1].copy() if reverse else out


def attack_release(x: np.ndarray, fps: float, attack: float, release: float) -> np.ndarray:
    """Opens with the `attack` time constant and falls with the (slower) `release`: the
    larger of the two low-passes, clipped to the input's peak (both vectorised)."""
    x = np.asarray(x, np.float32)
    fast, slow = one_pole(x, fps, attack), one_pole(x, fps, release)
    return np.minimum(np.maximum(fast, slow), x.max(initial=0.0)).astype(np.float32)


CENTROID_BAND = (80.0, 6000.0)  # Hz: voice harmonics; above, hiss and sibilants dominate


def frame_spectra(samples: np.ndarray, sr: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    """Power spectrum of the samples under each video frame, Hann-windowed over the
    frame's own samples (zero-padded to one FFT size for all): ((T, F) float32, (F,)
    frequencies in Hz). One FFT call per block of frames, no loop per frame. Read-only
    (the last results are shared: `_LastOf`)."""
    return _frame_spectra(np.asarray(samples, np.float32), sr, fps)


def _spectra(samples: np.ndarray, sr: int, fps: float) -> tuple[np.ndarray, np.ndarray]:
    bounds = frame_bounds(samples.size, sr, fps)
    n = bounds.size - 1
    length = max(8, int(round(sr / fps)))
    nfft = 1 << int(math.ceil(math.log2(length)))
    freqs = np.fft.rfftfreq(nfft, 1.0 / sr).astype(np.float32)
    out = np.zeros((n, freqs.size), np.float32)
    if n == 0:
        return out, freqs
    padded = np.concatenate([samples, np.zeros(length, np.float32)])
    window = np.hanning(length).astype(np.float32)
    valid = np.minimum(np.diff(bounds), length)
    for b0 in range(0, n, 2048):  # blocks bound the memory of the index array
        starts = bounds[b0 : min(b0 + 2048, n)]
        idx = starts[:, None] + np.arange(length)[None, :]
        seg = padded[idx] * window[None, :]
        seg[np.arange(length)[None, :] >= valid[b0 : b0 + starts.size, None]] = (
            0.0  # the last frame
        )
        out[b0 : b0 + starts.size] = np.abs(np.fft.rfft(seg, nfft, axis=1)) ** 2
    return out, freqs


_frame_spectra = _LastOf(_spectra)


def spectral_centroid(samples: np.ndarray, sr: int, fps: float) -> np.ndarray:
    """Spectral centroid (Hz) of the samples under each video frame, Hann-windowed,
    within CENTROID_BAND; 0 for a silent frame. (T,) float32, T = n_video_frames."""
    power, freqs = frame_spectra(samples, sr, fps)
    band = (freqs >= CENTROID_BAND[0]) & (freqs <= CENTROID_BAND[1])
    mag = np.sqrt(power[:, band])
    total = mag.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        centroid = np.where(total > 0, (mag @ freqs[band]) / total, 0.0)
    return centroid.astype(np.float32)


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
    clip's mean voiced centroid (geometric mean), in octaves: `octaves` below the mean is
    fully rounded, as far above fully spread, so a deep and a high voice both use the
    whole range. Silent frames are 0. A one-pole smoother (`smooth` seconds) keeps the
    shape from flickering at 25 fps.
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
    return one_pole(shape, fps, smooth) if smooth > 0 else shape


GATE_DB = -50.0  # dBFS: quieter frames are silent (the mouth closed)
LOOKBACK = 2  # frames back a frame's co-articulation reads
COARTICULATION = 1.2  # frames: the neighbours' weights fall off as exp(-|k| / this) ...


def coarticulate(
    x: np.ndarray, lookahead: int, lookback: int = LOOKBACK, width: float = COARTICULATION
) -> np.ndarray:
    """Each frame a weighted mean of frames t - lookback .. t + lookahead (edges held),
    weighted exp(-|k| / width)."""
    n = x.size
    if n == 0:
        return x.astype(np.float32)
    ks = np.arange(-lookback, lookahead + 1)
    w = np.exp(-np.abs(ks) / width)
    w /= w.sum()
    t = np.arange(n)
    return sum(wk * x[np.clip(t + k, 0, n - 1)] for k, wk in zip(ks, w, strict=True)).astype(
        np.float32
    )
