"""Face boxes as the landmark networks take them: checked once, in one place."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def check_boxes(frames: Sequence[np.ndarray], boxes: np.ndarray) -> np.ndarray:
    """(N, 4) float64 boxes, one per frame, each checked by `check_box`."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if len(frames) != len(boxes):
        raise ValueError(f"{len(frames)} frames but {len(boxes)} boxes; pass one box per frame")
    for box in boxes:
        check_box(box)
    return boxes


def check_box(box: np.ndarray) -> np.ndarray:
    b = np.asarray(box, dtype=np.float64).reshape(-1)
    if b.shape != (4,) or not np.isfinite(b).all() or b[2] <= b[0] or b[3] <= b[1]:
        raise ValueError(f"box={box!r} must be [x1, y1, x2, y2] with x2 > x1 and y2 > y1")
    return b
