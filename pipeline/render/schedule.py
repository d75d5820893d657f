"""Which stored frame each output frame shows.

A loop of N stored frames plays for as long as the audio lasts:
- "pingpong": 0, 1, ..., N-1, N-2, ..., 1, 0, 1, ... (period 2N-2), so a loop whose
  ends do not match never jumps;
- "cycle": t mod N, for loops recorded to be seamless at the boundary.
"""

from __future__ import annotations

import numpy as np

LOOP_MODES = ("pingpong", "cycle")


def _check(n: int, mode: str) -> None:
    if n < 1:
        raise ValueError(f"n={n} stored frames: an avatar needs at least one frame")
    if mode not in LOOP_MODES:
        raise ValueError(f"loop mode {mode!r} is not one of {', '.join(LOOP_MODES)}")


def frame_index(t: int, n: int, mode: str = "pingpong") -> int:
    """Stored frame index for output frame `t` (t >= 0) of a loop of `n` frames."""
    _check(n, mode)
    if n == 1:
        return 0
    if mode == "cycle":
        return t % n
    k = t % (2 * n - 2)
    return k if k < n else 2 * n - 2 - k


def schedule(T: int, n: int, mode: str = "pingpong") -> np.ndarray:
    """Stored frame indices for output frames 0..T-1, (T,) int64."""
    _check(n, mode)
    t = np.arange(max(T, 0), dtype=np.int64)
    if n == 1:
        return np.zeros_like(t)
    if mode == "cycle":
        return t % n
    k = t % (2 * n - 2)
    return np.where(k < n, k, 2 * n - 2 - k)
