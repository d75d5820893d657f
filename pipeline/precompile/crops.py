"""Half-face boxes and their 256x256 crops (precompile stage 4).

The box is MuseTalk's: from nose point 29 (moved down by `bbox_shift`) the box
reaches as far up as the lowest landmark is below it, so the nose sits on the
crop's horizontal middle and the mouth fills the lower half the renderer redraws.
"""

from __future__ import annotations

import math

import numpy as np

NOSE = 29  # iBUG-300W: nose bridge point just above the tip
BOTTOM_MARGIN = 10  # px below the lowest landmark, so the chin is not cut
MIN_SIDE = 2  # px; anything thinner is not a face


def half_face_box(
    landmarks: np.ndarray,
    bbox_shift: int,
    frame_shape: tuple[int, ...],
    fallback_box: np.ndarray,
) -> np.ndarray:
    """int32 [x1, y1, x2, y2] (x2, y2 exclusive) of the half-face crop.

    nose_y = landmarks[29].y + bbox_shift; half = max(landmark y) - nose_y;
    box = [floor(min x), floor(max(0, nose_y - half)), ceil(max x), ceil(max y) + 10],
    clamped to the frame. Non-finite landmarks, a box thinner than 2 px, or one
    off the frame fall back to `fallback_box` (the tracked box, clamped): never zeros.
    """
    pts = np.asarray(landmarks, dtype=np.float64)
    if pts.shape != (68, 2):
        raise ValueError(f"landmarks have shape {pts.shape}; expected (68, 2)")
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
