import numpy as np
import pytest

from hotplate import demo_data as synthetic
from pipeline.media import make_proxy
from pipeline.nets.detectors import load_detector
from pipeline.precompile.tracking import (
    NoFaceError,
    TrackResult,
    center_jitter,
    iou,
    select_face,
    track,
    track_naive,
)

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

NO_REFINE = {"refine_iou": 0.0, "refine_shift": float("inf")}


@pytest.fixture(scope="module")
def dlib():
    return load_detector("dlib", None)


def proxies(frames, proxy=480):
    return lambda i: make_proxy(frames[i], proxy)


def cover_face(frame, box, margin=60):
    """Paint over the face (and a margin) with the backdrop colour, leaving the patch."""
    out = frame.copy()
    x1, y1, x2, y2 = (box + np.array([-margin, -margin, margin, margin])).astype(int)
    out[max(0, y1) : y2, max(0, x1) : x2] = out[5, 5]
    return out


def test_iou():
    a = np.array([0, 0, 10, 10], np.float32)
    assert iou(a, a) == 1.0
    assert iou(a, a + np.array([5, 0, 5, 0])) == pytest.approx(50 / 150)
    assert iou(a, a + 20) == 0.0
    assert iou(a, np.zeros(4)) == 0.0  # degenerate box, no division by zero
    grid = iou(np.stack([a, a + 5])[:, None], np.stack([a, a + 20])[None])
    assert grid.shape == (2, 2)


def test_center_jitter_is_zero_for_linear_motion():
    t = np.arange(10, dtype=np.float32)[:, None]
    line = np.hstack([t, t, t + 5, t + 5])
    assert center_jitter(line) == 0.0
    assert center_jitter(line + np.array([[0, 0, 0, 0], [2, 0, 2, 0]] * 5)) > 0


def test_select_face_prefers_the_presenter_and_never_the_patch(dlib):
    frames, truth = synthetic.make_loop_frames(2)
    covered = cover_face(frames[1], truth[1])
    dets, patch_only = dlib.detect([frames[1], covered])
    assert len(patch_only) >= 1, "dlib should fire on the mission patch once the face is gone"
    shape = frames[1].shape
    face = select_face(dets, None, shape)
    assert iou(face, truth[1]) > 0.6
    assert iou(select_face(dets[::-1], None, shape), truth[1]) > 0.6  # order does not matter
    near = truth[1] + np.array([40, -30, 40, -30], np.float32)
    assert iou(select_face(dets, near, shape), truth[1]) > 0.6
    assert select_face(patch_only, truth[1], shape) is None  # too far from the last face
    assert select_face(np.zeros((0, 5), np.float32), truth[1], shape) is None


@pytest.mark.slow
def test_keyframe_tracking_matches_per_frame_detection(dlib):
    """Sway, breathing and a small turn: proxy keyframes as accurate as full-res every frame.

    Per-frame full-resolution detection costs ~0.16 s a frame, so the baseline runs on
    every other frame and both are compared there.
    """
    frames, truth = synthetic.make_loop_frames(96, motion="gentle", seed=0)
    even = slice(0, None, 2)
    naive = track_naive(frames[even], dlib)
    tracked = track(len(frames), proxies(frames), dlib)
    assert isinstance(tracked, TrackResult) and tracked.boxes.shape == (96, 4)
    assert tracked.keyframes == [*range(0, 96, 4), 95]
    naive_iou = iou(naive.boxes, truth[even]).mean()
    tracked_iou = iou(tracked.boxes[even], truth[even]).mean()
    assert tracked_iou >= naive_iou - 0.02, (tracked_iou, naive_iou)
    assert center_jitter(tracked.boxes[even]) <= center_jitter(naive.boxes)
    assert tracked.detections < 96 // 2 and naive.detections == 48
    per_frame = tracked.detector_seconds / tracked.detections
    assert naive.detector_seconds / naive.detections > 3 * per_frame  # the proxy is cheap
    assert not tracked.healed and not naive.healed


def test_adaptive_refinement_follows_a_fast_jump(dlib):
    frames, truth = synthetic.make_loop_frames(64, motion="jump", seed=0)
    jump = list(synthetic.jump_frames(64))
    fixed = track(64, proxies(frames), dlib, **NO_REFINE)
    adaptive = track(64, proxies(frames), dlib)
    assert iou(fixed.boxes, truth)[jump].min() < 0.6
    assert iou(adaptive.boxes, truth)[jump].min() > 0.6
    assert set(adaptive.refined) & set(jump) and not fixed.refined
    assert adaptive.detections == len(adaptive.keyframes) + len(adaptive.refined)


def test_no_face_names_the_source_and_the_frames(dlib):
    blank = [np.full((640, 360, 3), 40 + 5 * i, np.uint8) for i in range(20)]
    with pytest.raises(NoFaceError, match=r"blank\.mp4.*0, 4, 8, 12, 16, 19") as info:
        track(20, proxies(blank), dlib, source="blank.mp4")
    assert isinstance(info.value, ValueError)
    many = [blank[0]] * 200
    with pytest.raises(
        NoFaceError, match=r"11 frames tried \(0, 20, 40, 60, 80, \.\.\., 180, 199\)"
    ):
        track(200, proxies(many), dlib, stride=20)


def test_missing_keyframes_are_healed_and_the_patch_is_not_taken(dlib):
    frames, truth = synthetic.make_loop_frames(24, motion="gentle", seed=1)
    for i in (0, 12, 13):  # the first keyframe too: tracking must not start on the patch
        frames[i] = cover_face(frames[i], truth[i])
    frames[16] = np.full_like(frames[16], 128)  # nothing at all
    assert len(dlib.detect([make_proxy(frames[0], 480)[0]])[0]) >= 1  # the patch is there
    result = track(24, proxies(frames), dlib)
    assert result.healed == [0, 12, 16]
    assert np.isfinite(result.boxes).all()
    assert iou(result.boxes, truth).min() > 0.5


def test_progress_counts_and_small_cases(dlib):
    frames, truth = synthetic.make_loop_frames(9, size=(540, 960))
    seen = []
    result = track(9, proxies(frames), dlib, stride=1, progress=seen.append)
    assert sum(seen) == result.detections == 9 and result.keyframes == list(range(9))
    one = track(1, proxies(frames), dlib)
    assert one.keyframes == [0] and one.boxes.shape == (1, 4)
    assert iou(one.boxes[0], truth[0]) > 0.6
    with pytest.raises(ValueError, match="stride=0"):
        track(9, proxies(frames), dlib, stride=0)
    with pytest.raises(ValueError, match="n_frames"):
        track_naive(lambda i: frames[i], dlib)
    by_getter = track_naive(lambda i: frames[i], dlib, n_frames=3)
    assert by_getter.boxes.shape == (3, 4)
