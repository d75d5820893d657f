"""The independent referee: dlib's 68-point predictor, judging the project's landmarks.

dlib's model (face-recognition-models, trained on iBUG 300-W) may not ship as a default
(its terms exclude commercial use) but may judge: tests and benches only. It runs on its
own detector's box (dlib's HOG, the box it was trained on), never on the project's.

Errors are in units of the inter-ocular distance (outer eye corners 36 and 45, as 300-W
reports them), measured on the referee's points.
"""

from __future__ import annotations

from functools import cache

import numpy as np

LIP_CORNERS = (48, 54)
INNER_LIPS = tuple(range(60, 68))
LIPS = LIP_CORNERS + INNER_LIPS  # what the accuracy bound is on
OUTER_LIPS = tuple(range(48, 60))
JAW = tuple(range(17))
NOSE = tuple(range(27, 36))
EYES = tuple(range(36, 48))


@cache
def _models():
    import dlib

    from pipeline.nets.landmarks import dlib_model_path

    return dlib.get_frontal_face_detector(), dlib.shape_predictor(str(dlib_model_path()))


def referee_points(
    image_rgb: np.ndarray, near: tuple[float, float] | None = None
) -> np.ndarray | None:
    """dlib's (68, 2) points of the face nearest `near` ((x, y) fractions of the image;
    None: the largest), or None when dlib's detector finds no face. Small images are
    searched at 2x and 4x upsampling, as dlib's examples do."""
    import dlib

    detector, predictor = _models()
    img = np.ascontiguousarray(image_rgb, dtype=np.uint8)
    rects = []
    for upsample in (0, 1, 2):
        rects = list(detector(img, upsample))
        if rects or max(img.shape[:2]) * 2 ** (upsample + 1) > 2000:
            break
    if not rects:
        return None
    h, w = img.shape[:2]

    def rank(r: dlib.rectangle) -> float:
        if near is None:
            return -float(r.area())
        cx, cy = (r.left() + r.right()) / 2 / w, (r.top() + r.bottom()) / 2 / h
        return (cx - near[0]) ** 2 + (cy - near[1]) ** 2

    best = min(rects, key=rank)
    shape = predictor(img, best)
    return np.array([(shape.part(i).x, shape.part(i).y) for i in range(68)], np.float64)


def inter_ocular(points: np.ndarray) -> float:
    return float(np.linalg.norm(points[45] - points[36]))


def point_errors(points: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(68,) distance of each point from the referee's, as a fraction of the inter-ocular
    distance."""
    return np.linalg.norm(np.asarray(points, np.float64) - truth, axis=1) / inter_ocular(truth)


def lip_error(points: np.ndarray, truth: np.ndarray) -> float:
    """Median error over the lip corners and the inner lips (48, 54, 60-67), in units of
    the inter-ocular distance: the figure the accuracy bound is on."""
    return float(np.median(point_errors(points, truth)[list(LIPS)]))
