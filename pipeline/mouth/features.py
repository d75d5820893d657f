"""Audio features of each video frame, vectorised (no loop per frame).

`log_mel` is the mouth bank's feature: the power spectrum of the samples under each
video frame (`pipeline.render.audio.frame_spectra`) on a mel scale, in log units. A
model of the mouth reads a window of frames around the one it predicts (`stack`), from
a few frames back to the look-ahead a live render can afford (one frame).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

N_MELS = 32
MEL_BAND = (70.0, 7600.0)  # Hz
FLOOR = 1e-9  # power floor before the log: digital silence stays finite
CONTEXT = (-3, -2, -1, 0, 1)  # frames a prediction reads: 3 back, the one-frame look-ahead


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


def stack(feats: np.ndarray, offsets: tuple[int, ...] = CONTEXT) -> np.ndarray:
    """(T, F * len(offsets)): each frame's features beside those of its neighbours at
    `offsets` (clamped at the clip's ends)."""
    n = feats.shape[0]
    if n == 0:
        return np.zeros((0, feats.shape[1] * len(offsets)), np.float32)
    t = np.arange(n)
    return np.concatenate([feats[np.clip(t + o, 0, n - 1)] for o in offsets], axis=1)
