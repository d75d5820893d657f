"""`retinaface` landmarks: 68 points fitted to RetinaFace's 5, weights a studio may use.

dlib's 68-point model and every 2D-FAN are trained on iBUG 300-W, whose terms exclude
commercial use; mediapipe's FaceMesh (Apache-2.0) cannot be installed beside numpy 2
(docs/notebook/precompile.md). So the offline default takes the five points RetinaFace-MobileNet0.25
(MIT) finds (eye centres, nose tip, mouth corners) and places a mean 68-point face on
them with the least-squares affine map from the template's five points to the found
ones. Roll, scale, position, mouth width and some yaw follow the face; what five points
cannot see (how far the lips part, the jaw's own shape) is the template's. The error
against dlib's points is measured and stated in tests/pipeline/test_landmarks5.py.

The template lives in a frame where the eye centres are (-0.5, 0) and (0.5, 0). It was
measured once on the astronaut photo (skimage.data, public domain: dlib's points in
its HOG box, RetinaFace's five) and made
left-right symmetric (each point averaged with its mirror, MIRROR below), so the
photo's slight head turn is not baked in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_POINTS = 68
CROP = 256  # the face box's surroundings are resampled to this square before detection
CONTEXT = 2.0  # crop side / face box side

# iBUG-300W index of each point's mirror image (jaw 0 <-> 16, right eye <-> left eye...).
MIRROR = (
    *range(16, -1, -1),
    *range(26, 16, -1),
    27, 28, 29, 30,
    35, 34, 33, 32, 31,
    45, 44, 43, 42, 47, 46,
    39, 38, 37, 36, 41, 40,
    54, 53, 52, 51, 50, 49, 48,
    59, 58, 57, 56, 55,
    64, 63, 62, 61, 60,
    67, 66, 65,
)  # fmt: skip

# RetinaFace's points: subject's right eye, left eye, nose tip, right and left mouth corner.
TEMPLATE_5 = np.array(
    [[-0.5, 0.0], [0.5, 0.0], [0.0, 0.6388], [-0.49, 0.8757], [0.49, 0.8757]], np.float64
)
TEMPLATE_68 = np.array(
    [
        [-1.0786, 0.1031],
        [-1.0559, 0.3737],
        [-1.0201, 0.6435],
        [-0.974, 0.9141],
        [-0.8797, 1.1846],
        [-0.7159, 1.3952],
        [-0.5046, 1.5956],
        [-0.2581, 1.7484],
        [0.0, 1.7835],
        [0.2581, 1.7484],
        [0.5046, 1.5956],
        [0.7159, 1.3952],
        [0.8797, 1.1846],
        [0.974, 0.9141],
        [1.0201, 0.6435],
        [1.0559, 0.3737],
        [1.0786, 0.1031],
        [-0.9279, -0.1535],
        [-0.7985, -0.283],
        [-0.6113, -0.3064],
        [-0.4227, -0.283],
        [-0.2355, -0.2128],
        [0.2355, -0.2128],
        [0.4227, -0.283],
        [0.6113, -0.3064],
        [0.7985, -0.283],
        [0.9279, -0.1535],
        [0.0, -0.0022],
        [0.0, 0.185],
        [0.0, 0.3971],
        [0.0, 0.5843],
        [-0.2464, 0.6903],
        [-0.1294, 0.7137],
        [0.0, 0.7495],
        [0.1294, 0.7137],
        [0.2464, 0.6903],
        [-0.7042, 0.011],
        [-0.5872, -0.0592],
        [-0.4344, -0.0482],
        [-0.3049, 0.0578],
        [-0.4461, 0.0695],
        [-0.5865, 0.0695],
        [0.3049, 0.0578],
        [0.4344, -0.0482],
        [0.5872, -0.0592],
        [0.7042, 0.011],
        [0.5865, 0.0695],
        [0.4461, 0.0695],
        [-0.5397, 0.8914],
        [-0.3283, 0.8797],
        [-0.1411, 0.8782],
        [0.0, 0.9148],
        [0.1411, 0.8782],
        [0.3283, 0.8797],
        [0.5397, 0.8914],
        [0.3525, 1.1268],
        [0.1521, 1.2431],
        [0.0, 1.2673],
        [-0.1521, 1.2431],
        [-0.3525, 1.1268],
        [-0.4695, 0.9148],
        [-0.1411, 0.9733],
        [0.0, 0.985],
        [0.1411, 0.9733],
        [0.4695, 0.9148],
        [0.1411, 1.1137],
        [0.0, 1.1488],
        [-0.1411, 1.1137],
    ],
    np.float64,
)


def fit_affine(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(2, 3) least-squares affine map taking points src (K, 2) onto dst (K, 2)."""
    a = np.column_stack([np.asarray(src, np.float64), np.ones(len(src))])
    sol, *_ = np.linalg.lstsq(a, np.asarray(dst, np.float64), rcond=None)
    return sol.T


def points_from_five(five: np.ndarray) -> np.ndarray:
    """(68, 2) float32 iBUG points placed on RetinaFace's 5 points (5, 2)."""
    m = fit_affine(TEMPLATE_5, five)
    return (TEMPLATE_68 @ m[:, :2].T + m[:, 2]).astype(np.float32)


def box_to_five(box: np.ndarray) -> np.ndarray:
    """Where RetinaFace's 5 points sit, on average, in its box [x1, y1, x2, y2]: the
    fallback when the face box holds no detection (a keyframe that was interpolated)."""
    x1, y1, x2, y2 = np.asarray(box, np.float64)
    rel = np.array([[0.265, 0.295], [0.735, 0.295], [0.5, 0.59], [0.275, 0.7], [0.725, 0.7]])
    return rel * [x2 - x1, y2 - y1] + [x1, y1]


def _iou(boxes: np.ndarray, box: np.ndarray) -> np.ndarray:
    """IoU of each of boxes (K, 4) with one box (4,)."""
    w = np.clip(np.minimum(boxes[:, 2], box[2]) - np.maximum(boxes[:, 0], box[0]), 0, None)
    h = np.clip(np.minimum(boxes[:, 3], box[3]) - np.maximum(boxes[:, 1], box[1]), 0, None)
    inter = w * h
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (areas + (box[2] - box[0]) * (box[3] - box[1]) - inter + 1e-9)


class RetinaFiveLandmarker:
    """68 points from RetinaFace's 5 inside a tracked box (see the module docstring)."""

    name = "retinaface"

    def __init__(self) -> None:
        from pipeline.nets.detectors.retinaface import RetinaFaceDetector

        self._detector = RetinaFaceDetector(min_side=CROP)
        self.identity = "retinaface5-template2:" + self._detector.identity

    def five(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        """RetinaFace's (5, 2) points of the face in `box`, found on a crop around it."""
        import cv2

        b = np.asarray(box, np.float64).reshape(-1)
        if b.shape != (4,) or not np.isfinite(b).all() or b[2] <= b[0] or b[3] <= b[1]:
            raise ValueError(f"box={box!r} must be [x1, y1, x2, y2] with x2 > x1 and y2 > y1")
        centre = (b[:2] + b[2:]) / 2
        side = CONTEXT * max(b[2] - b[0], b[3] - b[1])
        k = CROP / side
        # Continuous coordinates map as u = (x - c) k + CROP / 2; cv2 puts pixel centres
        # at integers, hence the half-pixel terms.
        m = np.array(
            [
                [k, 0.0, (0.5 - centre[0]) * k + CROP / 2 - 0.5],
                [0.0, k, (0.5 - centre[1]) * k + CROP / 2 - 0.5],
            ]
        )
        crop = cv2.warpAffine(
            np.ascontiguousarray(frame_rgb),
            m,
            (CROP, CROP),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REPLICATE,
        )
        dets, points = self._detector.detect_with_points(crop)
        if len(dets) == 0:
            return box_to_five(b)
        # Back to frame pixels: x = (u + 0.5 - CROP / 2) / k + c - 0.5.
        frame_boxes = (dets[:, :4].reshape(-1, 2, 2) + 0.5 - CROP / 2) / k + centre - 0.5
        overlap = _iou(frame_boxes.reshape(-1, 4), b)
        best = int(np.argmax(overlap))
        if overlap[best] < 0.3:
            return box_to_five(b)
        return (points[best] + 0.5 - CROP / 2) / k + centre - 0.5

    def predict(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        return points_from_five(self.five(frame_rgb, box))

    def predict_batch(self, frames: Sequence[np.ndarray], boxes: np.ndarray) -> np.ndarray:
        out = [self.predict(f, b) for f, b in zip(frames, boxes, strict=True)]
        return np.stack(out) if out else np.zeros((0, N_POINTS, 2), np.float32)
