"""The face detector interface every backend implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Detector(Protocol):
    """Finds faces in RGB uint8 frames.

    `identity` changes exactly when the detector's output could change (a digest of the
    weights, or the version of a built-in model); it goes into the track stage key.
    """

    name: str
    identity: str

    def detect(self, frames: list[np.ndarray]) -> list[np.ndarray]:
        """One (K, 5) float32 array [x1, y1, x2, y2, score] per frame, in that frame's
        pixels, sorted by score, highest first; K may be 0."""
        ...


def empty_detections() -> np.ndarray:
    return np.zeros((0, 5), np.float32)


def sort_detections(dets: np.ndarray) -> np.ndarray:
    """(K, 5) float32 sorted by score, highest first (stable, so ties keep their order)."""
    dets = np.asarray(dets, np.float32).reshape(-1, 5)
    return dets[np.argsort(-dets[:, 4], kind="stable")]
