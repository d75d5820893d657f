import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.precompile.crops import clamp_box, crop_resize, half_face_box

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

FRAME = (400, 300, 3)  # H, W, C
TRACKED = np.array([90.0, 100.0, 210.0, 260.0], np.float32)


def face_points(x1=100.0, x2=200.0, nose_y=180.0, bottom=250.0) -> np.ndarray:
    """68 points spanning x1..x2 horizontally, nose point 29 at nose_y, lowest at bottom."""
    pts = np.zeros((68, 2), np.float32)
    pts[:, 0] = np.linspace(x1, x2, 68)
    pts[:, 1] = np.linspace(140.0, bottom, 68)
    pts[29] = ((x1 + x2) / 2, nose_y)
    return pts


def test_formula_exact():
    # half = 250 - 180 = 70, top = 180 - 70 = 110, bottom 250 + 10
    box = half_face_box(face_points(), 0, FRAME, TRACKED)
    assert box.dtype == np.int32
    assert box.tolist() == [100, 110, 200, 260]


def test_fractional_landmarks_round_outwards():
    box = half_face_box(face_points(100.4, 199.6, 180.0, 249.5), 0, FRAME, TRACKED)
    # half = 69.5, top = 110.5 -> 110; bottom ceil(249.5) + 10 = 260
    assert box.tolist() == [100, 110, 200, 260]


def test_bbox_shift_moves_the_top():
    # nose_y = 185, half = 65, top = 120 (the shift counts twice, as in MuseTalk)
    assert half_face_box(face_points(), 5, FRAME, TRACKED)[1] == 120
    assert half_face_box(face_points(), -5, FRAME, TRACKED)[1] == 100


def test_top_clamped_at_zero():
    box = half_face_box(face_points(nose_y=60.0), 0, FRAME, TRACKED)  # top = 60 - 190 < 0
    assert box[1] == 0


def test_bottom_margin_clamped_at_frame_edge():
    box = half_face_box(face_points(bottom=395.0), 0, FRAME, TRACKED)
    assert box[3] == FRAME[0]  # 395 + 10 clamped to 400
    box = half_face_box(face_points(bottom=385.0), 0, FRAME, TRACKED)
    assert box[3] == 395


def test_x_clamped_to_frame():
    box = half_face_box(face_points(x1=-20.0, x2=320.0), 0, FRAME, TRACKED)
    assert box[0] == 0 and box[2] == FRAME[1]


@pytest.mark.parametrize(
    "points",
    [
        np.full((68, 2), 150.3, np.float32),  # all equal
        np.where(np.arange(68)[:, None] == 7, np.nan, face_points()),  # one NaN
        face_points() + np.float32(1000.0),  # off the frame
        face_points(nose_y=400.0),  # nose below the chin: negative height
        np.full((68, 2), np.inf, np.float32),
    ],
    ids=["equal", "nan", "off-frame", "negative", "inf"],
)
def test_degenerate_falls_back_to_tracked_box(points):
    box = half_face_box(points, 0, FRAME, TRACKED)
    assert box.tolist() == [90, 100, 210, 260]


def test_fallback_is_clamped_and_never_zero():
    box = half_face_box(np.full((68, 2), np.nan), 0, FRAME, np.array([-30.5, 350.2, 20.0, 480.0]))
    assert box.tolist() == [0, 350, 20, 400]
    off = clamp_box(np.array([500.0, 500.0, 600.0, 600.0]), FRAME)
    assert off[2] > off[0] and off[3] > off[1]
    assert off[2] <= FRAME[1] and off[3] <= FRAME[0]


def test_wrong_shape_is_an_error():
    with pytest.raises(ValueError, match=r"\(68, 2\)"):
        half_face_box(np.zeros((5, 2)), 0, FRAME, TRACKED)


COORD = st.one_of(st.floats(-500, 1500), st.just(float("nan")))


@settings(max_examples=200, deadline=None)
@given(
    pts=st.lists(
        st.tuples(COORD, COORD),
        min_size=68,
        max_size=68,
    ),
    shift=st.integers(-50, 50),
)
def test_box_always_inside_frame_and_nonempty(pts, shift):
    box = half_face_box(np.array(pts, np.float32), shift, FRAME, TRACKED)
    x1, y1, x2, y2 = box.tolist()
    assert 0 <= x1 < x2 <= FRAME[1]
    assert 0 <= y1 < y2 <= FRAME[0]


def test_crop_resize_shape_and_content():
    frame = np.zeros(FRAME, np.uint8)
    frame[110:260, 100:200] = (200, 40, 90)
    crop = crop_resize(frame, np.array([100, 110, 200, 260]))
    assert crop.shape == (256, 256, 3) and crop.dtype == np.uint8
    assert (crop == (200, 40, 90)).all()
    assert crop_resize(frame, np.array([0, 0, 300, 400]), size=64).shape == (64, 64, 3)


def test_crop_resize_empty_box_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        crop_resize(np.zeros(FRAME, np.uint8), np.array([350, 10, 400, 50]))


def test_musetalk_crop_rules_per_version():
    from pipeline.precompile.crops import musetalk_box

    pts = np.zeros((68, 2))
    pts[:, 0] = np.linspace(100.7, 180.2, 68)
    pts[:, 1] = np.linspace(150.9, 260.6, 68)
    pts[29] = (140.5, 200.9)
    shape, fallback = (300, 400, 3), np.array([0, 0, 10, 10])
    # int32 truncation first: nose 200, bottom 260, top 200 - 60 = 140
    assert musetalk_box(pts, 0, shape, fallback, "v1.0").tolist() == [100, 140, 180, 260]
    assert musetalk_box(pts, 5, shape, fallback, "v1.0").tolist() == [100, 150, 180, 260]
    # v1.5 ignores bbox_shift and adds 10 px below, clamped to the frame height
    assert musetalk_box(pts, 5, shape, fallback, "v1.5").tolist() == [100, 140, 180, 270]
    assert musetalk_box(pts, 0, (265, 400, 3), fallback, "v1.5").tolist()[3] == 265
    # a box starting left of the frame falls back, as upstream falls back to the detector
    left = pts - (150, 0)
    assert musetalk_box(left, 0, shape, fallback, "v1.0").tolist() == [0, 0, 10, 10]
    assert half_face_box(pts, 0, shape, fallback, "v1.5").tolist() == [100, 140, 180, 270]
