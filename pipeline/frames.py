"""Stored frames: how the decode stage names them and how they are read back."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from cachestore.store import Store
from pipeline.parallel import ordered_map


class FrameSource:
    """Stored frames by index, decoded on demand (the source file is never reopened).
    Each call decodes a new array (`fresh`): the caller may write into it."""

    fresh = True

    def __init__(self, store: Store, blobs: dict[str, str], full_side: int) -> None:
        self.store, self.full_side = store, full_side
        self.digests = [blobs[k] for k in sorted(k for k in blobs if k.startswith("frame/"))]

    def __len__(self) -> int:
        return len(self.digests)

    def _blob(self, i: int) -> np.ndarray:
        with self.store.read() as r:
            return r.array(self.digests[i]).copy()  # the JPEG bytes, small; decoded outside the txn

    def __call__(self, i: int) -> np.ndarray:
        from pipeline.media import decode_frame

        return decode_frame(self._blob(i))

    def yuv(self, i: int):
        """Stored frame i as a new I420 `av.VideoFrame` (pipeline/yuv.py): what the hot
        path hands the encoder. The caller may write into it, unless it shares it (the
        render's frame cache does: `ScheduledFrames` says which frames are owned)."""
        from pipeline.media import decode_yuv

        return decode_yuv(self._blob(i))

    def frame_key(self, i: int) -> tuple:
        """What stored frame i decodes to, by content (pipeline/loop_frames.py's key)."""
        return ("frame", self.digests[i])

    def proxy(self, i: int, proxy: int) -> tuple[np.ndarray, float]:
        from pipeline.media import decode_proxy

        return decode_proxy(self._blob(i), self.full_side, proxy)

    def each(self) -> Iterator[np.ndarray]:
        """Every frame in order, decoded two at a time ahead of the consumer."""
        return ordered_map(self, range(len(self)), ahead=4)


class StilledFrames(FrameSource):
    """A FrameSource of a stilled loop (the still stage, `pipeline/precompile/still.py`):
    frame i decodes as stored, then the stage's patch of it, if it has one, is decoded
    (a small JPEG in the frame codec) and written over its rectangle, in I420 straight
    into the planes (`yuv`, the hot path) or in RGB (`__call__`). Proxies (tracking's)
    are of the frames as shot. `digests` are the stored frames'; `patch_digests` the
    patches' (None: the frame is shown as it is)."""

    def __init__(
        self,
        store: Store,
        blobs: dict[str, str],
        full_side: int,
        patch_blobs: dict[str, str],
        boxes: np.ndarray,
    ) -> None:
        super().__init__(store, blobs, full_side)
        self.boxes = np.asarray(boxes, np.int32)
        self.patch_digests = [patch_blobs.get(still_patch_name(i)) for i in range(len(self))]

    def frame_key(self, i: int) -> tuple:
        patch = self.patch_digests[i]
        if patch is None:
            return super().frame_key(i)
        return ("stilled", self.digests[i], patch, tuple(int(v) for v in self.boxes[i]))

    def _blobs(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        patch = self.patch_digests[i]
        with self.store.read() as r:  # both in one snapshot: a frame and its own patch
            frame = r.array(self.digests[i]).copy()
            return frame, (None if patch is None else r.array(patch).copy())

    def __call__(self, i: int) -> np.ndarray:
        from pipeline.media import decode_frame

        frame, patch = self._blobs(i)
        rgb = decode_frame(frame)
        if patch is not None:
            x1, y1, x2, y2 = (int(v) for v in self.boxes[i])
            rgb[y1:y2, x1:x2] = decode_frame(patch)
        return rgb

    def yuv(self, i: int):
        from pipeline.media import decode_yuv
        from pipeline.yuv import planes

        frame, patch = self._blobs(i)
        out = decode_yuv(frame)
        if patch is not None:
            x1, y1, x2, y2 = (int(v) for v in self.boxes[i])  # x1, y1 even
            for dst, src, k in zip(planes(out), planes(decode_yuv(patch)), (1, 2, 2), strict=True):
                h, w = dst[y1 // k :, x1 // k :].shape
                sh, sw = min(src.shape[0], h), min(src.shape[1], w)
                dst[y1 // k : y1 // k + sh, x1 // k : x1 // k + sw] = src[:sh, :sw]
        return out


def frame_name(i: int) -> str:
    return f"frame/{i:06d}"


def still_patch_name(i: int) -> str:
    """The still stage's name for frame i's stilled patch."""
    return f"still/{i:06d}"


# Decoded frames a render keeps for their next use (see ScheduledFrames): 64 MiB is 21
# I420 frames at 1080x1920, the whole of a ping-pong loop of up to 11 stored frames. A
# stored frame decodes in ~6 ms now, so a bigger cache buys little for the memory a stream
# holds (bench/bench_hot_path.py: a 128 MiB cache added ~100 MB to a stream's peak).
CACHE_BYTES = 64 << 20


def yuv_loader(load: Callable[[int], np.ndarray]) -> Callable[[int], object]:
    """i -> stored frame i as an I420 frame: FrameSource.yuv, or any RGB loader (the
    in-memory avatars of the tests) converted."""
    if hasattr(load, "yuv"):

        def decode(i: int):
            return load.yuv(i)

    else:

        def decode(i: int):
            from pipeline.yuv import frame_from_rgb

            return frame_from_rgb(load(i))

    decode.fresh = True  # a new frame per call: FFmpeg's decoder output, or converted
    return decode


def _nbytes(frame) -> int:
    if isinstance(frame, np.ndarray):
        return frame.nbytes
    from pipeline.yuv import nbytes

    return nbytes(frame)


class ScheduledFrames:
    """The stored frames of a render's schedule, in order, each decoded once per reuse
    window: a decoded frame is kept while its next use is among the nearest (Belady's
    rule: the schedule is known, so when the budget is full the frame needed last goes),
    so a ping-pong loop that fits in `budget` decodes each stored frame once. Only a
    frame that will still be kept at its next use is kept at all (`_useful`, the same rule
    played over the schedule once the first frame gives the size): a loop longer than
    the budget would otherwise keep, and so share, frames it drops before they come back.

    Iterating gives (t, idx, frame, owned): `owned` frames are the caller's to write into
    (`load` makes a new array per call, as FrameSource says with `fresh`, and the cache
    does not keep it); the others are shared, read-only.
    """

    def __init__(
        self, load: Callable[[int], np.ndarray], idxs: Sequence[int], budget: int = CACHE_BYTES
    ) -> None:
        self.load, self.idxs, self.budget = load, [int(i) for i in idxs], budget
        self.fresh = bool(getattr(load, "fresh", False))
        self.next_use = [0] * len(self.idxs)  # next t' > t showing the same frame
        seen: dict[int, int] = {}
        for t in range(len(self.idxs) - 1, -1, -1):
            self.next_use[t] = seen.get(self.idxs[t], 1 << 62)
            seen[self.idxs[t]] = t
        self.cache: dict[int, tuple[int, np.ndarray]] = {}  # idx -> (next use, frame)
        self.used = 0
        self.decoded = 0
        self.keep: list[bool] | None = None  # step t's frame is kept for its next use

    def _useful(self, fit: int) -> list[bool]:
        """Per step, whether keeping its frame ends in a hit: Belady's rule played over
        the schedule with room for `fit` frames, each keep marked when its frame comes
        back while still kept."""
        keep = [False] * len(self.idxs)
        kept: dict[int, tuple[int, int]] = {}  # idx -> (next use, step it was kept at)
        for t, i in enumerate(self.idxs):
            if i in kept:
                keep[kept.pop(i)[1]] = True
            nxt = self.next_use[t]
            if nxt >= 1 << 62 or fit <= 0:
                continue
            if len(kept) >= fit:
                far = max(kept, key=lambda k: kept[k][0])
                if kept[far][0] <= nxt:
                    continue
                del kept[far]
            kept[i] = (nxt, t)
        return keep

    def __iter__(self) -> Iterator[tuple[int, int, np.ndarray, bool]]:
        for t, i in enumerate(self.idxs):
            hit = self.cache.pop(i, None)
            if hit is not None:
                frame = hit[1]
                self.used -= _nbytes(frame)
            else:
                frame = self.load(i)
                self.decoded += 1
                if self.fresh and isinstance(frame, np.ndarray):
                    frame.flags.writeable = False  # it may be kept: nobody writes into it
            nxt = self.next_use[t]
            if self.keep is None:  # the frames of one avatar are all one size
                self.keep = self._useful(self.budget // max(_nbytes(frame), 1))
            if self.keep[t] and self._make_room(_nbytes(frame), nxt):
                self.cache[i] = (nxt, frame)
                self.used += _nbytes(frame)
                yield t, i, frame, False
            else:
                owned = hit is None and self.fresh
                if owned and isinstance(frame, np.ndarray):
                    frame.flags.writeable = True
                yield t, i, frame, owned

    def _make_room(self, nbytes: int, nxt: int) -> bool:
        """Evict frames needed later than `nxt` until `nbytes` fit; False if they cannot."""
        while self.used + nbytes > self.budget:
            if not self.cache:
                return False
            far = max(self.cache, key=lambda k: self.cache[k][0])
            if self.cache[far][0] <= nxt:
                return False  # everything kept is needed sooner than this one
            self.used -= _nbytes(self.cache.pop(far)[1])
        return True
