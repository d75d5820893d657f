"""Keyframe-decoupled face tracking (ARCHITECTURE.md, precompile stage 2).

The detector runs on keyframes K = {0, S, 2S, ...} | {N-1} of a small proxy; every
other frame is interpolated linearly between its neighbouring detections. Where two
neighbouring detections disagree (a fast move or turn), the frame between them is
detected too, recursively, until neighbours agree or are adjacent. Keyframes without a
face borrow from the nearest good detections.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.nets.detectors.base import Detector
from pipeline.precompile.recipe import parse_face_hint

MAX_SHIFT = 2.0  # a detection farther than this many face sizes from the last face is not it
BATCH = 16  # frames per detector call


class NoFaceError(ValueError):
    """No face in any frame the tracker tried; the message names the source and the frames."""


@dataclass
class TrackResult:
    boxes: np.ndarray  # (N, 4) float32, full-frame pixels
    keyframes: list[int]  # the fixed stride set K
    refined: list[int] = field(default_factory=list)  # detected by adaptive refinement
    healed: list[int] = field(default_factory=list)  # keyframes without a face, interpolated
    detections: int = 0  # frames the detector ran on
    detector_seconds: float = 0.0


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise IoU of boxes [..., 4] (broadcasting: a[:, None], b[None] for a matrix)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = w * h
    area_a = np.clip(a[..., 2] - a[..., 0], 0, None) * np.clip(a[..., 3] - a[..., 1], 0, None)
    area_b = np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)
    union = area_a + area_b - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _centre(box: np.ndarray) -> np.ndarray:
    return (box[..., :2] + box[..., 2:4]) / 2


def _size(box: np.ndarray) -> np.ndarray:
    return np.sqrt(
        np.clip(box[..., 2] - box[..., 0], 0, None) * np.clip(box[..., 3] - box[..., 1], 0, None)
    )


def center_jitter(boxes: np.ndarray) -> float:
    """Mean absolute second difference of the box centre, px per frame^2 (0 for a line)."""
    centres = _centre(np.asarray(boxes, np.float64))
    if len(centres) < 3:
        return 0.0
    return float(np.abs(np.diff(centres, n=2, axis=0)).sum(axis=1).mean())


def _first_pick_value(
    dets: np.ndarray, frame_shape: tuple[int, ...], face: str = "auto"
) -> np.ndarray:
    """How presenter-like each detection is with nothing to go on. "auto": large, central,
    confident; "largest", "central", or nearest a point "x,y" (see parse_face_hint).
    Every value is >= 0, so -1 can stand for "no detection"."""
    height, width = frame_shape[:2]
    hint = parse_face_hint(face)
    rel_size = _size(dets) / min(height, width)
    confidence = 1.0 / (1.0 + np.exp(-dets[:, 4]))
    target = np.array([width / 2, height / 2])
    if isinstance(hint, tuple):
        target = np.array([hint[0] * width, hint[1] * height])
    offset = np.linalg.norm(_centre(dets) - target, axis=1) / np.hypot(width, height)
    if hint == "largest":
        return rel_size
    if hint == "central" or isinstance(hint, tuple):
        return 1.0 / (1.0 + 50.0 * offset)  # nearest wins; size only breaks near-ties
    centrality = 1.0 - 0.5 * np.clip(2.0 * offset, 0, 1)
    return rel_size * centrality * confidence


def select_face(
    dets: np.ndarray,
    prev_box: np.ndarray | None,
    frame_shape: tuple[int, ...],
    face: str = "auto",
) -> np.ndarray | None:
    """The presenter's box (4,) among detections (K, 5), or None.

    Without a previous box: the most presenter-like by the `face` hint (see
    _first_pick_value; "auto" is large, central, high score). With
    one: the detection nearest to it (centre distance in face sizes, less IoU), and none
    if even that is more than MAX_SHIFT face sizes away, so a missed face is not replaced
    by a face-like patch elsewhere in the frame.
    """
    dets = np.asarray(dets, np.float32).reshape(-1, 5)
    dets = dets[np.all(np.isfinite(dets), axis=1)]
    if len(dets) == 0:
        return None
    if prev_box is None:
        return dets[int(np.argmax(_first_pick_value(dets, frame_shape, face))), :4].copy()
    prev = np.asarray(prev_box, np.float64)
    shift = np.linalg.norm(_centre(dets) - _centre(prev), axis=1) / max(float(_size(prev)), 1.0)
    best = int(np.argmin(shift - iou(dets[:, :4], prev)))
    return dets[best, :4].copy() if shift[best] <= MAX_SHIFT else None


def _disagree(a: np.ndarray, b: np.ndarray, refine_iou: float, refine_shift: float) -> bool:
    size = (float(_size(a)) + float(_size(b))) / 2
    shift = float(np.linalg.norm(_centre(a) - _centre(b)))
    return float(iou(a, b)) < refine_iou or shift > refine_shift * size


def _select_along(
    order: Sequence[int],
    raw: dict[int, np.ndarray],
    frame_shape: tuple[int, ...],
    face: str = "auto",
) -> dict[int, np.ndarray]:
    """Pick one face per frame along `order`, each near the previous pick.

    Starts from the frame whose best pick is most presenter-like and walks both ways
    from there, so a first frame that only shows the wrong thing cannot set the course.
    """
    values = [
        float(_first_pick_value(raw[i], frame_shape, face).max()) if len(raw[i]) else -1.0
        for i in order
    ]
    start = int(np.argmax(values))
    if values[start] < 0:
        return {}
    found: dict[int, np.ndarray] = {}
    for walk in (order[start:], order[start::-1]):
        prev = found.get(order[start])
        for i in walk:
            box = select_face(raw[i], prev, frame_shape, face)
            if box is not None:
                found[i] = box
                prev = box
    return found


def _interpolate(n_frames: int, found: dict[int, np.ndarray]) -> np.ndarray:
    """Boxes for every frame, linear between detections, held flat past the ends."""
    anchors = np.array(sorted(found))
    values = np.stack([found[i] for i in anchors]).astype(np.float64)
    t = np.arange(n_frames)
    return np.stack([np.interp(t, anchors, values[:, c]) for c in range(4)], 1).astype(np.float32)


def _middle(a: int, b: int, tried: dict[int, np.ndarray]) -> int | None:
    """The untried frame nearest the middle of (a, b), if any (a failed keyframe is tried)."""
    untried = [m for m in range(a + 1, b) if m not in tried]
    return min(untried, key=lambda m: abs(2 * m - a - b)) if untried else None


def _abbrev(frames: Sequence[int]) -> str:
    frames = sorted(frames)
    if len(frames) <= 8:
        return ", ".join(map(str, frames))
    return ", ".join(map(str, frames[:5])) + ", ..., " + ", ".join(map(str, frames[-2:]))


def _no_face(source: str, tried: Sequence[int]) -> NoFaceError:
    return NoFaceError(
        f"{source}: no face found in any of the {len(tried)} frames tried "
        f"({_abbrev(tried)}); use a video where the presenter faces the camera, "
        "or try detector=s3fd"
    )


class _Runner:
    """Runs the detector on frames in batches, keeping full-frame detections and timing."""

    def __init__(
        self,
        get_image: Callable[[int], tuple[np.ndarray, float]],
        detector: Detector,
        progress: Callable[[int], None] | None,
        batch: int,
    ) -> None:
        self.get_image = get_image
        self.detector = detector
        self.progress = progress
        self.batch = batch
        self.raw: dict[int, np.ndarray] = {}
        self.seconds = 0.0
        self.frame_shape: tuple[int, ...] = ()

    def run(self, indices: Sequence[int]) -> None:
        for start in range(0, len(indices), self.batch):
            chunk = list(indices[start : start + self.batch])
            images, scales = zip(*(self.get_image(i) for i in chunk), strict=True)
            if not self.frame_shape:
                h, w = images[0].shape[:2]
                self.frame_shape = (round(h / scales[0]), round(w / scales[0]))
            t0 = time.perf_counter()
            dets = self.detector.detect(list(images))
            self.seconds += time.perf_counter() - t0
            for i, d, s in zip(chunk, dets, scales, strict=True):
                d = np.array(d, np.float32).reshape(-1, 5)
                d[:, :4] /= s
                self.raw[i] = d
            if self.progress is not None:
                self.progress(len(chunk))


def track(
    n_frames: int,
    get_proxy: Callable[[int], tuple[np.ndarray, float]],
    detector: Detector,
    stride: int = 4,
    refine_iou: float = 0.7,
    refine_shift: float = 0.10,
    face: str = "auto",
    progress: Callable[[int], None] | None = None,
    source: str = "<video>",
) -> TrackResult:
    """Track the presenter's face over `n_frames` frames.

    get_proxy(i) returns frame i's detection proxy and its scale (proxy px / frame px),
    e.g. `media.make_proxy(frame, recipe.proxy)`. progress(k) is called after each
    detector batch with the number of frames just detected (like tqdm's update).
    Refinement is off with refine_iou=0 and refine_shift=inf. `face` says which face is
    the presenter where there are several (parse_face_hint). Raises NoFaceError
    (naming `source`) when no tried frame has a face.
    """
    if n_frames < 1:
        raise ValueError(f"n_frames={n_frames} must be >= 1")
    if stride < 1:
        raise ValueError(f"stride={stride} must be >= 1")
    runner = _Runner(get_proxy, detector, progress, BATCH)

    # 1. detect the fixed keyframes and pick the face along them
    keyframes = sorted(set(range(0, n_frames, stride)) | {n_frames - 1})
    runner.run(keyframes)
    found = _select_along(keyframes, runner.raw, runner.frame_shape, face)
    if not found:
        raise _no_face(source, keyframes)

    # 2. refine, one round at a time so each round is one batch: detect a frame between
    #    every pair of neighbouring detections that disagree
    refined: list[int] = []
    anchors = sorted(found)
    pairs = [
        (a, b)
        for a, b in zip(anchors, anchors[1:], strict=False)
        if _disagree(found[a], found[b], refine_iou, refine_shift)
    ]
    while pairs:
        mids = {(a, b): m for a, b in pairs if (m := _middle(a, b, runner.raw)) is not None}
        runner.run(sorted(set(mids.values())))
        pairs = []
        for (a, b), m in mids.items():
            box = select_face(runner.raw[m], (found[a] + found[b]) / 2, runner.frame_shape)
            if box is None:
                continue  # leave this gap interpolated rather than guess
            found[m] = box
            refined.append(m)
            pairs += [
                (x, y)
                for x, y in ((a, m), (m, b))
                if _disagree(found[x], found[y], refine_iou, refine_shift)
            ]

    # 3. interpolate every other frame; keyframes without a face are healed by it
    return TrackResult(
        boxes=_interpolate(n_frames, found),
        keyframes=keyframes,
        refined=sorted(refined),
        healed=[k for k in keyframes if k not in found],
        detections=len(runner.raw),
        detector_seconds=runner.seconds,
    )


def track_naive(
    frames: Sequence[np.ndarray] | Callable[[int], np.ndarray],
    detector: Detector,
    n_frames: int | None = None,
    source: str = "<video>",
) -> TrackResult:
    """Baseline: detect every frame at full resolution, same detector and selection rule.

    `frames` is a sequence of frames or a getter i -> frame (then pass n_frames).
    """
    if callable(frames):
        if n_frames is None:
            raise ValueError("track_naive: pass n_frames with a frame getter")
        getter = frames
    else:
        n_frames = len(frames) if n_frames is None else n_frames
        getter = frames.__getitem__
    if n_frames < 1:
        raise ValueError(f"n_frames={n_frames} must be >= 1")
    runner = _Runner(lambda i: (getter(i), 1.0), detector, None, 1)
    every = list(range(n_frames))
    runner.run(every)
    found = _select_along(every, runner.raw, runner.frame_shape)
    if not found:
        raise _no_face(source, every)
    return TrackResult(
        boxes=_interpolate(n_frames, found),
        keyframes=every,
        healed=[i for i in every if i not in found],
        detections=n_frames,
        detector_seconds=runner.seconds,
    )
