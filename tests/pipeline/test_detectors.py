import numpy as np
import pytest
import torch

from hotplate.demo_data import make_loop_frames
from pipeline.media import make_proxy
from pipeline.nets import models
from pipeline.nets.detectors import load_detector
from pipeline.nets.detectors.base import Detector
from pipeline.nets.detectors.nms import batched_nms, box_iou
from pipeline.nets.detectors.s3fd import decode_candidates, postprocess
from pipeline.nets.models import ModelMissingError, file_identity, find_weights
from pipeline.precompile.tracking import iou

S3FD_FILE = "s3fd-619a316812.pth"


@pytest.fixture(autouse=True)
def no_hub_cache(tmp_path, monkeypatch):
    """Keep the user's torch hub cache out of these tests."""
    monkeypatch.setattr(models, "HUB_CHECKPOINTS", tmp_path / "hub")


# ------------------------------------------------------------------ references (tests only)


def iou_ref(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms_ref(boxes, scores, threshold, idxs=None):
    """Textbook greedy NMS, one box at a time."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable, like argsort(stable)
    keep = []
    for i in order:
        if all(
            iou_ref(boxes[i], boxes[k]) <= threshold or (idxs is not None and idxs[i] != idxs[k])
            for k in keep
        ):
            keep.append(i)
    return keep


def random_boxes(rng, n, clusters=4):
    centres = rng.uniform(0, 200, (clusters, 2))[rng.integers(clusters, size=n)]
    centres += rng.normal(0, 8, centres.shape)
    size = rng.uniform(10, 60, (n, 2))
    return np.concatenate([centres - size / 2, centres + size / 2], 1).astype(np.float32)


# ------------------------------------------------------------------ NMS


@pytest.mark.parametrize("seed", range(40))
def test_batched_nms_equals_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 120))
    boxes = random_boxes(rng, n)
    scores = rng.random(n).astype(np.float32)
    if seed % 3 == 0 and n:  # ties in score keep input order
        scores = np.round(scores * 4) / 4
    idxs = rng.integers(0, 3, n) if seed % 2 else None
    threshold = float(rng.choice([0.0, 0.3, 0.5, 0.7]))
    got = batched_nms(
        torch.from_numpy(boxes),
        torch.from_numpy(scores),
        threshold,
        None if idxs is None else torch.from_numpy(idxs),
    )
    assert got.tolist() == nms_ref(boxes.tolist(), scores.tolist(), threshold, idxs)


def test_box_iou_matches_reference():
    rng = np.random.default_rng(1)
    a, b = random_boxes(rng, 7), random_boxes(rng, 5)
    got = box_iou(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    want = np.array([[iou_ref(x, y) for y in b.tolist()] for x in a.tolist()])
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(iou(a[:, None], b[None]), want, atol=1e-6)


# ------------------------------------------------------------------ S3FD decoding


def random_outputs(batch, height, width, seed):
    """Fake network outputs shaped like s3fd's for a height x width input."""
    g = torch.Generator().manual_seed(seed)
    outputs = []
    for level in range(6):
        stride = 2 ** (level + 2)
        h, w = -(-height // stride), -(-width // stride)
        outputs.append(torch.randn(batch, 2, h, w, generator=g) * 2.0)
        outputs.append(torch.randn(batch, 4, h, w, generator=g))
    return outputs


def test_decode_equals_face_alignment_reference():
    from face_alignment.detection.sfd.detect import get_predictions

    outputs = random_outputs(1, 96, 128, seed=0)
    boxes, scores, images = decode_candidates(outputs, 0.05)
    got = np.column_stack([boxes.numpy(), scores.numpy()])
    soft = [torch.softmax(o, 1).numpy() if i % 2 == 0 else o.numpy() for i, o in enumerate(outputs)]
    want = get_predictions(soft, 1)[0]  # face_alignment's per-candidate Python loop
    assert len(got) == len(want) > 50 and (images.numpy() == 0).all()
    key = lambda a: a[np.lexsort(a.T[::-1])]  # noqa: E731
    np.testing.assert_allclose(key(got), key(want), rtol=1e-5, atol=1e-3)


def test_postprocess_equals_reference_on_a_batch():
    from face_alignment.detection.sfd.detect import get_predictions

    outputs = random_outputs(2, 64, 96, seed=3)
    got = postprocess(outputs, 2)
    for b in range(2):
        per_image = [o[b : b + 1] for o in outputs]
        soft = [
            torch.softmax(o, 1).numpy() if i % 2 == 0 else o.numpy()
            for i, o in enumerate(per_image)
        ]
        cand = get_predictions(soft, 1)[0]
        keep = nms_ref(cand[:, :4].tolist(), cand[:, 4].tolist(), 0.3)
        want = cand[keep]
        want = want[want[:, 4] > 0.5]
        assert got[b].dtype == np.float32 and got[b].shape[1] == 5
        np.testing.assert_allclose(got[b], want, rtol=1e-5, atol=1e-3)


# ------------------------------------------------------------------ loading


@pytest.fixture(scope="module")
def s3fd_dir(tmp_path_factory):
    from face_alignment.detection.sfd.net_s3fd import s3fd

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("models")
    torch.save(s3fd().state_dict(), folder / S3FD_FILE)
    return folder


def test_s3fd_end_to_end_on_random_weights(s3fd_dir):
    detector = load_detector("s3fd", s3fd_dir)
    assert isinstance(detector, Detector) and detector.name == "s3fd"
    assert detector.identity == file_identity(s3fd_dir / S3FD_FILE)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (64, 96, 3), np.uint8) for _ in range(3)]
    frames.append(rng.integers(0, 255, (80, 64, 3), np.uint8))  # a second shape: own batch
    results = detector.detect(frames)
    assert len(results) == 4
    for dets in results:
        assert dets.dtype == np.float32 and dets.ndim == 2 and dets.shape[1] == 5
        assert (np.diff(dets[:, 4]) <= 0).all() and (dets[:, 4] > 0.5).all()
    # batching does not change the answer
    np.testing.assert_allclose(detector.detect(frames[1:2])[0], results[1], rtol=1e-4, atol=1e-3)


def test_s3fd_wrong_weights_is_a_clear_error(tmp_path):
    torch.save({"conv1_1.weight": torch.zeros(1)}, tmp_path / S3FD_FILE)
    with pytest.raises(ValueError, match="not S3FD weights"):
        load_detector("s3fd", tmp_path)


def test_missing_s3fd_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(ModelMissingError, match=r"s3fd-619a316812\.pth.*hotplate doctor") as info:
        load_detector("s3fd", tmp_path / "empty")
    assert str(tmp_path / "empty" / S3FD_FILE) in str(info.value)
    assert str(tmp_path / "hub" / S3FD_FILE) in str(info.value)
    assert isinstance(info.value, FileNotFoundError)


def test_unknown_detector():
    with pytest.raises(ValueError, match="detector='yolo'"):
        load_detector("yolo", None)


def test_find_weights_order_and_identity_cache(tmp_path):
    hub = models.HUB_CHECKPOINTS
    hub.mkdir(parents=True)
    (hub / "w.bin").write_bytes(b"hub")
    assert find_weights(tmp_path, ["w.bin"], "test") == hub / "w.bin"
    (tmp_path / "w.bin").write_bytes(b"mine")
    assert find_weights(tmp_path, ["x.bin", "w.bin"], "test") == tmp_path / "w.bin"
    first = file_identity(tmp_path / "w.bin")
    assert first == file_identity(tmp_path / "w.bin") and len(first) == 32
    (tmp_path / "w.bin").write_bytes(b"other bytes")
    assert file_identity(tmp_path / "w.bin") != first


# ------------------------------------------------------------------ dlib HOG


def test_dlib_finds_the_astronaut():
    from skimage import data

    detector = load_detector("dlib", None)
    assert detector.identity.startswith("dlib-hog-")
    dets = detector.detect([data.astronaut()])[0]
    assert dets.dtype == np.float32 and dets.shape[1] == 5
    assert (np.diff(dets[:, 4]) <= 0).all()
    assert iou(dets[0, :4], np.array([175, 76, 266, 167])) > 0.7


def test_dlib_on_the_proxy_of_a_presenter_frame():
    frames, truth = make_loop_frames(2)
    proxy, scale = make_proxy(frames[1], 480)
    dets = load_detector("dlib", None).detect([proxy, np.zeros_like(proxy)])
    assert iou(dets[0][0, :4] / scale, truth[1]) > 0.6
    assert dets[1].shape == (0, 5)
