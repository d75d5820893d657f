"""Half-face boxes and their 256x256 crops (precompile stage 4).

The box is MuseTalk's: from nose point 29 (moved down by `bbox_shift`) the box
reaches as far up as the lowest landmark is below it, so the nose sits on the
crop's horizontal middle and the mouth fills the lower half the renderer redraws.

Three rule sets (the recipe's `crop_rules`):
- "hotplate": sub-pixel landmarks, the box grown to whole pixels, 10 px below the chin,
  clamped to the frame;
- "v1.5" and "v1.0": upstream MuseTalk's exactly (`get_landmark_and_bbox` in
  musetalk/utils/preprocessing.py, then scripts/realtime_inference.py): landmarks
  truncated to int32 first, no bottom margin in the landmark box; v1.5 ignores bbox_shift
  and adds `extra_margin` 10 px to y2 (clamped to the frame height), v1.0 honours
  bbox_shift and adds nothing.
"""

from __future__ import annotations

import math

import numpy as np

NOSE = 29  # iBUG-300W: nose bridge point just above the tip
BOTTOM_MARGIN = 10  # px below the lowest landmark, so the chin is not cut
MIN_SIDE = 2  # px; anything thinner is not a face
EXTRA_MARGIN = 10  # px added below the box by MuseTalk v1.5 (realtime_inference's default)


def half_face_box(
    landmarks: np.ndarray,
    bbox_shift: int,
    frame_shape: tuple[int, ...],
    fallback_box: np.ndarray,
    rules: str = "hotplate",
) -> np.ndarray:
    """int32 [x1, y1, x2, y2] (x2, y2 exclusive) of the half-face crop.

    `rules` "v1.5" or "v1.0": upstream MuseTalk's box (see `musetalk_box`); else:

    nose_y = landmarks[29].y + bbox_shift; half = max(landmark y) - nose_y;
    box = [floor(min x), floor(max(0, nose_y - half)), ceil(max x), ceil(max y) + 10],
    clamped to the frame. Non-finite landmarks, a box thinner than 2 px, or one
    off the frame fall back to `fallback_box` (the tracked box, clamped): never zeros.
    """
    pts = np.asarray(landmarks, dtype=np.float64)
    if pts.shape != (68, 2):
        raise ValueError(f"landmarks have shape {pts.shape}; expected (68, 2)")
    if rules in ("v1.5", "v1.0"):
        return musetalk_box(pts, bbox_shift, frame_shape, fallback_box, rules)
    h, w = int(frame_shape[0]), int(frame_shape[1])
    if np.isfinite(pts).all():
        nose_y = pts[NOSE, 1] + bbox_shift
        bottom = pts[:, 1].max()
        top = nose_y - (bottom - nose_y)
        x1 = max(0, math.floor(pts[:, 0].min()))
        x2 = min(w, math.ceil(pts[:, 0].max()))
        y1 = max(0, math.floor(top))
        y2 = min(h, math.ceil(bottom) + BOTTOM_MARGIN)
        # Extents are checked before rounding: all-equal points would otherwise
        # round to a 1 px box.
        face_ok = pts[:, 0].max() - pts[:, 0].min() >= MIN_SIDE and bottom - top >= MIN_SIDE
        if face_ok and x2 - x1 >= MIN_SIDE and y2 - y1 >= MIN_SIDE:
            return np.array([x1, y1, x2, y2], dtype=np.int32)
    return clamp_box(fallback_box, frame_shape)


def musetalk_box(
    landmarks: np.ndarray,
    bbox_shift: int,
    frame_shape: tuple[int, ...],
    fallback_box: np.ndarray,
    version: str = "v1.5",
) -> np.ndarray:
    """Upstream MuseTalk's half-face box for one frame, integer for integer.

    pts = landmarks as int32 (truncated); v1.0 moves pts[29].y down by bbox_shift (v1.5
    ignores it); half = max(pts.y) - pts[29].y; box = [min x, max(0, pts[29].y - half),
    max x, max y]. A box that is empty or starts left of the frame is replaced by the
    (clamped) fallback box, as upstream falls back to the detector's. v1.5 then adds 10 px
    to y2, clamped to the frame height.
    """
    pts = np.asarray(landmarks, np.float64)
    box = None
    if np.isfinite(pts).all():
        lm = pts.astype(np.int32)
        if version == "v1.0":
            lm[NOSE, 1] += int(bbox_shift)  # upstream shifts the point in place, before the max
        nose_y = int(lm[NOSE, 1])
        bottom = int(lm[:, 1].max())
        y1 = max(0, nose_y - (bottom - nose_y))
        x1, x2 = int(lm[:, 0].min()), int(lm[:, 0].max())
        if bottom - y1 > 0 and x2 - x1 > 0 and x1 >= 0:
            box = np.array([x1, y1, x2, bottom], dtype=np.int32)
    if box is None:
        box = clamp_box(fallback_box, frame_shape)
    if version == "v1.5":
        box[3] = min(int(box[3]) + EXTRA_MARGIN, int(frame_shape[0]))
    return box


def clamp_box(box: np.ndarray, frame_shape: tuple[int, ...]) -> np.ndarray:
    """int32 box grown to whole pixels and clamped to the frame, at least 1 px each way."""
    b = np.asarray(box, dtype=np.float64).reshape(-1)
    if b.shape != (4,) or not np.isfinite(b).all():
        raise ValueError(f"fallback box {box!r} is not 4 finite numbers; the track is broken")
    h, w = int(frame_shape[0]), int(frame_shape[1])
    x1 = min(max(0, math.floor(b[0])), w - 1)
    y1 = min(max(0, math.floor(b[1])), h - 1)
    x2 = min(max(x1 + 1, math.ceil(b[2])), w)
    y2 = min(max(y1 + 1, math.ceil(b[3])), h)
    return np.array([x1, y1, x2, y2], dtype=np.int32)


def crop_resize(frame: np.ndarray, box: np.ndarray, size: int = 256) -> np.ndarray:
    """(size, size, 3) uint8: the frame inside `box`, resized with Lanczos (as MuseTalk)."""
    import cv2

    x1, y1, x2, y2 = (int(v) for v in np.asarray(box).reshape(-1))
    h, w = frame.shape[:2]
    x1, x2 = max(0, x1), min(w, x2)
    y1, y2 = max(0, y1), min(h, y2)
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"crop box {list(np.asarray(box))} is empty inside a {w}x{h} frame")
    region = np.ascontiguousarray(frame[y1:y2, x1:x2])
    return cv2.resize(region, (size, size), interpolation=cv2.INTER_LANCZOS4).astype(np.uint8)
