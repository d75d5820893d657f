"""Lip geometry from landmarks, the canonical face frame, and a mouth's shape.

Everything here reads the 68-point scheme (iBUG-300W order), which every landmarker
hotplate has gives, the dense face mesh included (it is mapped onto it): the lips are
points 48-59 (outer) and 60-67 (inner). The topology is data, in the index lists below,
never numbers scattered through the code. A landmarker with more lip points only has to
map them onto these.

The canonical frame is the one `pipeline/nets/landmarks5.py`'s template lives in: eye
centres at (-0.5, 0) and (0.5, 0), y down, so one unit is the inter-ocular distance. A
face is brought there by the similarity (rotation, uniform scale, shift) that best maps
its eyes and nose onto the template's: points that do not move when the mouth does, so
mouths of two frames compare by shape, not by where the head happened to be.
"""

from __future__ import annotations

import numpy as np

OUTER_LIPS = tuple(range(48, 60))
INNER_LIPS = tuple(range(60, 68))
LIPS = OUTER_LIPS + INNER_LIPS
UPPER_INNER = (60, 61, 62, 63, 64)  # inner lip lines, corner to corner
LOWER_INNER = (60, 67, 66, 65, 64)
INNER_PAIRS = ((61, 67), (62, 66), (63, 65))  # upper and lower inner lip, face left to right
CORNERS = (48, 54)
OUTER_MID = (51, 57)  # top of the upper lip, bottom of the lower lip
EYES = tuple(range(36, 48))
NOSE = tuple(range(27, 36))
STABLE = NOSE + EYES  # what the canonical fit uses: the mouth and jaw move, these do not
JAW = tuple(range(0, 17))
SHAPE_NAMES = ("opening", "width", "height")  # a mouth's shape, canonical units


def similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(2, 3) similarity transform (rotation, uniform scale, translation) that maps the
    points `src` (P, 2) onto `dst` (P, 2) in the least-squares sense (Umeyama)."""
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    ms, md = src.mean(0), dst.mean(0)
    a, b = src - ms, dst - md
    var = float((a**2).sum())
    if var < 1e-12:
        raise ValueError("the points to align are all in one place")
    u, sig, vt = np.linalg.svd(b.T @ a)
    d = np.ones(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        d[-1] = -1.0
    rot = u @ np.diag(d) @ vt
    scale = float((sig * d).sum()) / var
    m = np.zeros((2, 3))
    m[:, :2] = scale * rot
    m[:, 2] = md - m[:, :2] @ ms
    return m


def apply(m: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Points (..., 2) through the (2, 3) affine map `m`."""
    pts = np.asarray(pts, np.float64)
    return pts @ m[:, :2].T + m[:, 2]


def invert(m: np.ndarray) -> np.ndarray:
    """The inverse of a (2, 3) affine map."""
    a = np.linalg.inv(m[:, :2])
    return np.concatenate([a, (-a @ m[:, 2])[:, None]], axis=1)


def template() -> np.ndarray:
    """(68, 2) the mean face in the canonical frame."""
    from pipeline.nets.landmarks5 import TEMPLATE_68

    return TEMPLATE_68


def to_canonical(lm: np.ndarray) -> np.ndarray:
    """(2, 3) frame -> canonical similarity of one face's landmarks (68, 2)."""
    idx = list(STABLE)
    return similarity(np.asarray(lm)[idx], template()[idx])


def mouth_shape(lm: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
    """(3,) float32 (opening, width, height) of the mouth in canonical units: the gap
    between the inner lips (0 closed), the distance between the corners, and the outer
    lips' height (top of the upper to the bottom of the lower lip). `m`: the face's
    canonical map, when known."""
    lm = np.asarray(lm, np.float64)
    c = apply(to_canonical(lm) if m is None else m, lm)
    upper, lower = zip(*INNER_PAIRS, strict=True)
    opening = max(0.0, float((c[list(lower), 1] - c[list(upper), 1]).mean()))
    width = float(np.linalg.norm(c[CORNERS[1]] - c[CORNERS[0]]))
    height = float(c[OUTER_MID[1], 1] - c[OUTER_MID[0], 1])
    return np.array([opening, width, height], np.float32)


def mouth_shapes(landmarks: np.ndarray) -> np.ndarray:
    """(N, 3) `mouth_shape` of each frame's landmarks (N, 68, 2); NaN where a frame has
    no face."""
    out = np.full((len(landmarks), 3), np.nan, np.float32)
    for i, lm in enumerate(landmarks):
        if np.isfinite(lm).all():
            out[i] = mouth_shape(lm)
    return out
