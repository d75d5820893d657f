"""Audio features of each video frame, vectorised (no loop per frame).

`log_mel` is the mouth bank's feature: the power spectrum of the samples under each
video frame (`pipeline.render.audio.frame_spectra`) on a mel scale, in log units. A
model of the mouth reads a window of frames around the one it predicts (`windowed`):
the log-mel over MEL_CONTEXT and its first N_MFCC cepstral coefficients (`mfcc`, the
log-mel's DCT) over MFCC_CONTEXT, both looking ahead as well as back (the mouth moves
towards a sound before it is heard). A live render has less look-ahead than that: the
window it is prepared on ends a frame past its last frame, and `stack` holds the last
frame's features beyond it.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

N_MELS = 32
MEL_BAND = (70.0, 7600.0)  # Hz
FLOOR = 1e-9  # power floor before the log: digital silence stays finite
N_MFCC = 13
# frames a prediction reads (25 fps): on six real clips held out (bench_mouth_real) the
# model looking 3-4 frames ahead followed the truth's lip gap at r 0.33 on average,
# one frame ahead at 0.2
MFCC_CONTEXT = tuple(range(-3, 4))
MEL_CONTEXT = tuple(range(-4, 5))


def _mel(f: np.ndarray | float) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(f, np.float64) / 700.0)


@lru_cache(maxsize=8)
def mel_filters(freqs_key: tuple[float, int, float], n_mels: int = N_MELS) -> np.ndarray:
    """(F, n_mels) triangular filters for rfft bins (step, count, sr) on the mel scale."""
    step, count, _ = freqs_key
    freqs = np.arange(count) * step
    lo, hi = MEL_BAND[0], min(MEL_BAND[1], freqs[-1])
    edges = 700.0 * (10 ** (np.linspace(_mel(lo), _mel(hi), n_mels + 2) / 2595.0) - 1.0)
    f = freqs[:, None]
    left, mid, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    up = (f - left) / np.maximum(mid - left, 1e-6)
    down = (right - f) / np.maximum(right - mid, 1e-6)
    tri = np.clip(np.minimum(up, down), 0.0, None)
    # each filter sums to 1, so a band's value does not depend on how many bins it spans
    return (tri / np.maximum(tri.sum(0, keepdims=True), 1e-12)).astype(np.float32)


def log_mel(samples: np.ndarray, sr: int, fps: float, n_frames: int | None = None) -> np.ndarray:
    """(T, N_MELS) float32 log10 mel power of each video frame (T = n_frames, padded with
    silence or cut; default: every frame the audio covers)."""
    from pipeline.render.audio import frame_spectra

    power, freqs = frame_spectra(np.asarray(samples, np.float32), sr, fps)
    step = float(freqs[1] - freqs[0]) if freqs.size > 1 else float(sr)
    filters = mel_filters((step, int(freqs.size), float(sr)))
    out = np.log10(power @ filters + FLOOR).astype(np.float32)
    if n_frames is not None:
        if out.shape[0] < n_frames:
            pad = np.full((n_frames - out.shape[0], out.shape[1]), math.log10(FLOOR), np.float32)
            out = np.concatenate([out, pad])
        out = out[:n_frames]
    return out


@lru_cache(maxsize=4)
def dct_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_in, n_out) the orthonormal DCT-II's first n_out basis vectors."""
    k = np.arange(n_out)[None, :]
    i = np.arange(n_in)[:, None]
    m = np.cos(np.pi * (i + 0.5) * k / n_in) * math.sqrt(2.0 / n_in)
    m[:, 0] /= math.sqrt(2.0)
    return m.astype(np.float32)


def mfcc(feats: np.ndarray, n: int = N_MFCC) -> np.ndarray:
    """(T, n) the cepstrum of log-mel `feats` (T, N_MELS): the spectrum's envelope in a
    few smooth terms, which generalise from a few seconds of footage where 32 bands
    overfit."""
    return (feats @ dct_matrix(feats.shape[1], n)).astype(np.float32)


def windowed(feats: np.ndarray, ahead: int | None = None) -> np.ndarray:
    """(T, N_MFCC * len(MFCC_CONTEXT) + N_MELS * len(MEL_CONTEXT)): what the bank's model
    reads for each frame of log-mel `feats`; `ahead`: the most frames ahead it may read
    (a live render's look-ahead: later offsets read that frame instead)."""

    def cut(offsets: tuple[int, ...]) -> tuple[int, ...]:
        return offsets if ahead is None else tuple(min(o, ahead) for o in offsets)

    return np.concatenate(
        [stack(mfcc(feats), cut(MFCC_CONTEXT)), stack(feats, cut(MEL_CONTEXT))], axis=1
    )


def stack(feats: np.ndarray, offsets: tuple[int, ...]) -> np.ndarray:
    """(T, F * len(offsets)): each frame's features beside those of its neighbours at
    `offsets` (clamped at the clip's ends)."""
    n = feats.shape[0]
    if n == 0:
        return np.zeros((0, feats.shape[1] * len(offsets)), np.float32)
    t = np.arange(n)
    return np.concatenate([feats[np.clip(t + o, 0, n - 1)] for o in offsets], axis=1)
