import numpy as np
import pytest
from skimage import data

from pipeline.nets.models import ModelMissingError
from pipeline.precompile.crops import half_face_box
from pipeline.precompile.masks import (
    BISENET_WEIGHTS,
    bisenet_mask,
    blend_square,
    landmark_mask,
    load_face_parser,
    square_region,
)

FRAME = (512, 512, 3)


def synthetic_face(cx=220.0, cy=120.0, w=90.0) -> np.ndarray:
    """A plausible 68-point face: jaw arc from eye level, brows, nose, eyes, mouth."""
    pts = np.zeros((68, 2))
    t = np.linspace(0, np.pi, 17)
    pts[0:17] = np.stack([cx - w / 2 * np.cos(t), cy + 0.55 * w * np.sin(t)], 1)
    pts[17:27] = np.stack(
        [np.linspace(cx - 0.4 * w, cx + 0.4 * w, 10), np.full(10, cy - 0.2 * w)], 1
    )
    pts[27:31] = np.stack([np.full(4, cx), np.linspace(cy - 0.05 * w, cy + 0.2 * w, 4)], 1)
    pts[31:36] = np.stack(
        [np.linspace(cx - 0.1 * w, cx + 0.1 * w, 5), np.full(5, cy + 0.25 * w)], 1
    )
    eye = np.stack(
        [np.cos(np.linspace(0, 2 * np.pi, 7)[:6]), np.sin(np.linspace(0, 2 * np.pi, 7)[:6])], 1
    )
    pts[36:42] = (cx - 0.2 * w, cy - 0.08 * w) + eye * (0.08 * w, 0.03 * w)
    pts[42:48] = (cx + 0.2 * w, cy - 0.08 * w) + eye * (0.08 * w, 0.03 * w)
    ring = np.linspace(0, 2 * np.pi, 13)[:12]
    pts[48:60] = np.stack(
        [cx + 0.18 * w * np.cos(ring), cy + 0.38 * w + 0.07 * w * np.sin(ring)], 1
    )
    ring = np.linspace(0, 2 * np.pi, 9)[:8]
    pts[60:68] = np.stack(
        [cx + 0.12 * w * np.cos(ring), cy + 0.38 * w + 0.03 * w * np.sin(ring)], 1
    )
    return pts.astype(np.float32)


@pytest.fixture
def face():
    lm = synthetic_face()
    crop_box = half_face_box(lm, 0, FRAME, np.array([170, 60, 270, 180]))
    return lm, crop_box, blend_square(crop_box)


def mask_rc(point, square, size=256):
    """Mask (row, col) of a frame point."""
    scale = size / (square[2] - square[0])
    return int((point[1] - square[1]) * scale), int((point[0] - square[0]) * scale)


def middle_row(crop_box, square, size=256):
    scale = size / (square[2] - square[0])
    return int(np.round(((crop_box[1] + crop_box[3]) / 2 - square[1]) * scale))


def test_blend_square_is_1_5x_and_centred():
    sq = blend_square(np.array([100, 100, 200, 180]))
    assert sq.dtype == np.int32
    assert sq.tolist() == [75, 65, 225, 215]  # half-side int(100 // 2 * 1.5) = 75
    tall = blend_square(np.array([10, 20, 50, 120]))  # h = 100 is the longer side
    assert tall[2] - tall[0] == tall[3] - tall[1] == 150
    assert blend_square(np.array([0, 0, 40, 40]))[0] < 0  # not clipped to the frame


def test_landmark_mask(face):
    lm, crop_box, square = face
    mask = landmark_mask(lm, crop_box, square, size=256, feather=0.1)
    assert mask.shape == (256, 256) and mask.dtype == np.uint8
    mid = middle_row(crop_box, square)
    assert 120 <= mid <= 136  # the square is centred on the crop box
    assert (mask[:mid] == 0).all()  # exactly zero above the crop box's middle
    r, c = mask_rc(lm[57], square)  # lower lip: well inside the lower face
    assert mask[r, c] == 255
    assert ((mask > 0) & (mask < 255)).any()  # feathered
    # nothing far outside the crop box (beyond the blur reach)
    r2, c2 = mask_rc((crop_box[2] + 20, crop_box[3] + 20), square)
    assert mask[r2:, :].max() == 0 and mask[:, c2:].max() == 0


def test_landmark_mask_without_feather_is_binary(face):
    lm, crop_box, square = face
    mask = landmark_mask(lm, crop_box, square, feather=0.0)
    assert set(np.unique(mask)) == {0, 255}
    assert (mask[: middle_row(crop_box, square)] == 0).all()


def test_landmark_mask_other_size(face):
    lm, crop_box, square = face
    assert landmark_mask(lm, crop_box, square, size=128).shape == (128, 128)


def test_landmark_mask_rejects_nan(face):
    lm, crop_box, square = face
    lm = lm.copy()
    lm[3] = np.nan
    with pytest.raises(ValueError, match="landmarks"):
        landmark_mask(lm, crop_box, square)


def test_square_region_pads_outside_the_frame():
    frame = np.full((100, 100, 3), 7, np.uint8)
    region = square_region(frame, np.array([-10, 80, 30, 120]))
    assert region.shape == (40, 40, 3)
    assert (
        (region[:20, 10:] == 7).all() and (region[:, :10] == 0).all() and (region[20:] == 0).all()
    )


@pytest.fixture
def bisenet_dir(tmp_path, monkeypatch):
    """A random BiSeNet whose last layer always prefers class 1 (skin), saved as
    79999_iter.pth; the real architecture and loading path, untrained weights."""
    import torch

    from pipeline.nets.bisenet import build_bisenet

    for var in ("HOME", "TORCH_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "home"))
    torch.manual_seed(0)
    net = build_bisenet()
    with torch.no_grad():
        w = net.conv_out.conv_out.weight
        w.zero_()
        w[1] = 1.0  # features are post-ReLU (>= 0), so class 1 wins wherever any is > 0
    models = tmp_path / "models"
    models.mkdir()
    torch.save(net.state_dict(), models / BISENET_WEIGHTS[0])
    return models


def test_bisenet_keys_match_the_original_checkpoint():
    from pipeline.nets.bisenet import build_bisenet

    keys = set(build_bisenet().state_dict())
    for k in (
        "cp.resnet.conv1.weight",
        "cp.resnet.layer2.0.downsample.0.weight",
        "cp.resnet.layer4.1.bn2.running_var",
        "cp.arm16.conv_atten.weight",
        "cp.arm32.bn_atten.weight",
        "cp.conv_avg.conv.weight",
        "ffm.convblk.conv.weight",
        "ffm.conv2.weight",
        "conv_out.conv_out.weight",
        "conv_out16.conv.bn.weight",
        "conv_out32.conv_out.weight",
    ):
        assert k in keys


def test_bisenet_parse_and_mask(bisenet_dir):
    parser = load_face_parser("bisenet", bisenet_dir)
    assert parser.name == "bisenet" and len(parser.identity) == 32
    image = data.astronaut()
    labels = parser.parse(image[60:200, 150:290])
    assert labels.shape == (512, 512) and labels.dtype == np.uint8  # upstream parses at 512
    assert labels.max() <= 18

    lm = synthetic_face()
    crop_box = half_face_box(lm, 0, FRAME, np.array([170, 60, 270, 180]))
    square = blend_square(crop_box)
    mask = bisenet_mask(parser, image, crop_box, square, size=256, feather=0.1)
    assert mask.shape == (256, 256) and mask.dtype == np.uint8
    # upstream clears the upper half and then blurs: a ramp of half a kernel above it
    ramp = int(0.1 * 256 // 2) + 1
    assert (mask[: middle_row(crop_box, square) - ramp] == 0).all()
    r, c = mask_rc(lm[57], square)
    assert mask[r, c] > 0
    assert ((mask > 0) & (mask < 255)).any()


def test_face_parser_missing_and_unknown(tmp_path, monkeypatch):
    for var in ("HOME", "TORCH_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "home"))
    with pytest.raises(ModelMissingError, match="79999_iter.pth"):
        load_face_parser("bisenet", tmp_path)
    with pytest.raises(ValueError, match="segformer"):
        load_face_parser("segformer", tmp_path)


def test_face_parser_rejects_a_wrong_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / BISENET_WEIGHTS[0]).write_bytes(b"junk")
    with pytest.raises(ValueError, match="not a BiSeNet"):
        load_face_parser("bisenet", tmp_path)
