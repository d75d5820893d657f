"""A worker process's stored loop frames, decoded to I420 once and shared by its sessions.

A conversation at rest shows its avatar's stored loop, pass after pass; each frame it
shows is a stored JPEG decoded and converted to the encoder's I420 (FFmpeg, ~4.3 ms a
frame at 1080x1920, against 0.5 at 540x960). A render's own frame cache
(`pipeline.frames.ScheduledFrames`, 64 MiB) holds a ping-pong loop of 11 frames at
1080x1920, so a 50-frame loop was decoded again on every pass. Here each loop frame is
decoded once per process and kept, read-only, for every pass and every session of the
process that shows it.

The key is the frame's content (`FrameSource.frame_key`: the stored JPEG's digest, and a
stilled frame's patch digest and rectangle), so two sessions of one avatar share its
frames and a re-precompiled avatar's new frames are new keys; loaders without one (the
tests' in-memory avatars) are not cached here.

The budget (BUDGET_ENV, default DEFAULT_BUDGET): what the kept frames' planes may take
in the process. 256 MiB holds a 50-frame loop at 1080x1920 (156 MB) and two more of
540x960 (39 MB each). A frame is kept while it is in use: each `get` says when its
caller will ask for it again at the latest (its loop's period, in seconds); a frame not
asked for within twice that, plus a second, is stale, and only stale frames are evicted
to make room, the longest unused first. When the budget is full of frames in use, a new
frame is decoded for its caller alone (owned: the caller may write into it) and not
kept, so a loop past the budget keeps its first frames and decodes the rest each pass,
rather than each frame evicting the one needed next.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

BUDGET_ENV = "HOTPLATE_LOOP_FRAMES"  # bytes, or 64M, 1G (cachestore.space.parse_size)
DEFAULT_BUDGET = 256 << 20
STALE_AFTER = 1.0  # s past twice its period before an unused frame may be evicted


def budget_from_env() -> int:
    """The process's budget: BUDGET_ENV, or DEFAULT_BUDGET; 0 keeps nothing."""
    from cachestore.space import parse_size

    got = os.environ.get(BUDGET_ENV, "").strip()
    if not got:
        return DEFAULT_BUDGET
    if got == "0":
        return 0
    try:
        return int(parse_size(got))
    except ValueError as exc:
        raise ValueError(f"{BUDGET_ENV}: {exc} (0 keeps no frames)") from None


@dataclass
class _Kept:
    planes: np.ndarray  # (h * 3 / 2, w) I420, even h and w, read-only
    color_range: int
    nbytes: int
    last_use: float
    period: float


class LoopFrames:
    """Decoded frames by key within `budget` bytes (the module doc gives the policy).
    Thread-safe: decodes run outside the lock, so two callers missing one key may both
    decode it; the first kept is the one kept."""

    def __init__(self, budget: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget, self.clock = int(budget), clock
        self._kept: dict[Hashable, _Kept] = {}
        self._lock = threading.Lock()
        self.used = 0
        self.hits = self.decoded = 0

    def get(
        self, key: Hashable, decode: Callable[[], object], period: float
    ) -> tuple[object, bool]:
        """(frame, owned) for `key`. A kept frame comes as a new `av.VideoFrame` over the
        kept planes (no copy: the caller may stamp its pts, but not write its pixels);
        a frame the budget cannot keep is `decode()`'s own, the caller's (owned True).
        `period`: s until the caller asks for this key again, at most."""
        now = self.clock()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                kept.last_use, kept.period = now, max(kept.period, float(period))
                self.hits += 1
                return _view(kept), False
        frame = decode()
        with self._lock:
            self.decoded += 1
            if key in self._kept:  # another caller kept it meanwhile
                return frame, True
            size = _packed_bytes(frame)
            if not self._make_room(size, now):
                return frame, True
            self.used += size
        kept = _Kept(_packed(frame), getattr(frame, "color_range", 1), size, now, float(period))
        with self._lock:
            if key not in self._kept:
                self._kept[key] = kept
            else:  # kept by another caller while this one was packed
                self.used -= size
        return _view(kept), False

    def _make_room(self, size: int, now: float) -> bool:
        """Evict stale frames, longest unused first, until `size` fits; False if it cannot."""
        if self.used + size <= self.budget:
            return True
        stale = sorted(
            (k for k, v in self._kept.items() if now - v.last_use > 2 * v.period + STALE_AFTER),
            key=lambda k: self._kept[k].last_use,
        )
        for k in stale:
            self.used -= self._kept.pop(k).nbytes
            if self.used + size <= self.budget:
                return True
        return False

    def __len__(self) -> int:
        return len(self._kept)


def _packed_bytes(frame) -> int:
    return (frame.height // 2) * (frame.width // 2) * 6


def _packed(frame) -> np.ndarray:
    """`frame`'s planes (cropped to even, as the encoder takes it) in one contiguous
    read-only I420 array, the layout `av.VideoFrame.from_numpy_buffer` wraps."""
    from pipeline.yuv import planes

    y, u, v = planes(frame)
    h, w = y.shape[0] & ~1, y.shape[1] & ~1
    out = np.empty((h * 3 // 2, w), np.uint8)
    out[:h] = y[:h, :w]
    flat, q = out.reshape(-1), (h // 2) * (w // 2)
    flat[h * w : h * w + q] = u[: h // 2, : w // 2].reshape(-1)
    flat[h * w + q :] = v[: h // 2, : w // 2].reshape(-1)
    out.flags.writeable = False
    return out


def _view(kept: _Kept):
    """A new frame object over the kept planes (each use stamps its own pts)."""
    import av

    frame = av.VideoFrame.from_numpy_buffer(kept.planes, format="yuv420p")
    frame.color_range = kept.color_range
    return frame


_SHARED: LoopFrames | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> LoopFrames:
    """The process's LoopFrames, made on first use with `budget_from_env()`."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = LoopFrames(budget_from_env())
        return _SHARED
