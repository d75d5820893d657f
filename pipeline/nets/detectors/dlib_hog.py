"""dlib's HOG frontal face detector: built into dlib, so it works on a fresh machine."""

from __future__ import annotations

import numpy as np

from pipeline.nets.detectors.base import empty_detections, sort_detections

# HOG's window is 80 px, so faces under ~80 px are missed. A presenter's face in a
# 480-px proxy of a 1920-px frame is ~75-90 px: frames with a longer side under
# MIN_SIDE are enlarged to it first (1.33x for the proxy, ~16 ms a frame, as accurate
# as detecting the full frame in bench/bench_tracking.py); a frame with no face then
# gets one more try at dlib's 2x upsampling (faces down to ~30 proxy px).
MIN_SIDE = 640


class DlibHogDetector:
    name = "dlib"

    def __init__(self, min_side: int = MIN_SIDE, adjust_threshold: float = 0.0) -> None:
        import dlib

        self._detector = dlib.get_frontal_face_detector()
        self.min_side = min_side
        self.adjust_threshold = adjust_threshold
        self.identity = f"dlib-hog-{dlib.__version__}"

    def detect(self, frames: list[np.ndarray]) -> list[np.ndarray]:
        return [self._detect_one(frame) for frame in frames]

    def _detect_one(self, frame: np.ndarray) -> np.ndarray:
        import cv2

        factor = max(1.0, self.min_side / max(frame.shape[:2]))
        img = frame
        if factor > 1.0:
            size = (round(frame.shape[1] * factor), round(frame.shape[0] * factor))
            img = cv2.resize(frame, size, interpolation=cv2.INTER_LINEAR)
        img = np.ascontiguousarray(img, dtype=np.uint8)
        for upsample in (0, 1):
            rects, scores, _ = self._detector.run(img, upsample, self.adjust_threshold)
            if rects:
                break
        if not rects:
            return empty_detections()
        # dlib rectangles are inclusive; our boxes have exclusive x2, y2.
        boxes = np.array(
            [[r.left(), r.top(), r.right() + 1, r.bottom() + 1] for r in rects], np.float32
        )
        sx, sy = img.shape[1] / frame.shape[1], img.shape[0] / frame.shape[0]
        boxes /= np.array([sx, sy, sx, sy], np.float32)
        return sort_detections(np.column_stack([boxes, np.asarray(scores, np.float32)]))
