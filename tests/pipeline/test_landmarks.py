import numpy as np
import pytest
from skimage import data

from pipeline.nets.landmarks import (
    FAN_WEIGHTS,
    _crop,
    fan_crop_geometry,
    heatmap_to_points,
    load_landmarker,
)
from pipeline.nets.models import ModelMissingError

FACE = np.array([175.0, 76.0, 265.0, 166.0])  # dlib HOG's box on the astronaut's face


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return data.astronaut()


@pytest.fixture
def no_hub_cache(tmp_path, monkeypatch):
    """Keep a developer's ~/.cache/torch from satisfying 'missing weights' tests."""
    for var in ("HOME", "TORCH_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "home"))


def test_dlib_on_astronaut(astronaut):
    lm = load_landmarker("dlib", None)
    assert lm.name == "dlib" and len(lm.identity) == 32
    pts = lm.predict(astronaut, FACE)
    assert pts.shape == (68, 2) and pts.dtype == np.float32
    x1, y1, x2, y2 = FACE
    nose = pts[30]
    assert x1 <= nose[0] <= x2 and y1 <= nose[1] <= y2
    assert pts[48:68, 1].mean() > nose[1]  # mouth below the nose tip
    assert pts[8, 1] > pts[57, 1]  # chin below the lower lip
    jaw = pts[0:17, 0].max() - pts[0:17, 0].min()
    assert 0.7 * (x2 - x1) <= jaw <= 1.4 * (x2 - x1)
    batch = lm.predict_batch([astronaut, astronaut], np.stack([FACE, FACE]))
    assert batch.shape == (2, 68, 2)
    np.testing.assert_array_equal(batch[0], pts)


def test_unknown_landmarker():
    with pytest.raises(ValueError, match="mmpose"):
        load_landmarker("mmpose", None)


def test_crop_and_heatmap_round_trip():
    """A dot in the frame lands where the crop transform says, and a heatmap peak
    decodes back to the same frame point."""
    frame = np.zeros((300, 400, 3), np.uint8)
    dot = np.array([231.0, 140.0])
    frame[140, 231] = 255
    box = np.array([180.0, 90.0, 290.0, 200.0])
    center, side = fan_crop_geometry(box)
    crop = _crop(frame, center, side)
    cy, cx = np.unravel_index(crop[..., 0].argmax(), crop.shape[:2])
    # back to the frame with the inverse of the crop transform (continuous coords)
    back = (np.array([cx, cy]) + 0.5 - 128) * side / 256 + center - 0.5
    assert np.abs(back - dot).max() <= side / 256 + 0.5

    hm = np.zeros((68, 64, 64), np.float32)
    u = (dot + 0.5 - center) * 64 / side + 32 - 0.5  # heatmap pixel of the dot
    yy, xx = np.mgrid[0:64, 0:64]
    hm[:] = np.exp(-((xx - u[0]) ** 2 + (yy - u[1]) ** 2) / 2.0)
    pts = heatmap_to_points(hm, center, side)
    assert pts.shape == (68, 2) and pts.dtype == np.float32
    # argmax + quarter-pixel step: within a quarter heatmap pixel plus rounding
    assert np.abs(pts - dot).max() <= 0.5 * side / 64


def _tiny_fan():
    import torch
    from face_alignment.models import FAN

    torch.manual_seed(0)
    return FAN(1).eval()


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_fan_state_dict_and_torchscript(tmp_path, astronaut, no_hub_cache):
    import torch

    net = _tiny_fan()
    sd_dir, ts_dir = tmp_path / "sd", tmp_path / "ts"
    sd_dir.mkdir()
    ts_dir.mkdir()
    # face_alignment 1.5 ships a plain state_dict; older versions a TorchScript zip.
    torch.save({f"module.{k}": v for k, v in net.state_dict().items()}, sd_dir / FAN_WEIGHTS[0])
    traced = torch.jit.trace(net, torch.rand(1, 3, 64, 64), strict=False, check_trace=False)
    traced.save(str(ts_dir / "2DFAN4-cd938726ad.zip"))

    lm = load_landmarker("fan", sd_dir)
    assert lm.name == "fan" and len(lm.identity) == 32
    pts = lm.predict(astronaut, FACE)
    assert pts.shape == (68, 2) and pts.dtype == np.float32
    center, side = fan_crop_geometry(FACE)
    assert np.isfinite(pts).all()
    assert (np.abs(pts - center) <= side / 2 + 1).all()  # inside the network's crop

    ts = load_landmarker("fan", ts_dir)
    np.testing.assert_allclose(ts.predict(astronaut, FACE), pts, atol=1e-3)
    assert ts.identity != lm.identity


def test_fan_missing_weights(tmp_path, no_hub_cache):
    with pytest.raises(ModelMissingError, match="2DFAN4") as err:
        load_landmarker("fan", tmp_path)
    assert str(tmp_path) in str(err.value)


def test_fan_rejects_a_wrong_file(tmp_path, no_hub_cache):
    import torch

    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / FAN_WEIGHTS[0])
    with pytest.raises(ValueError, match="not a 2D-FAN"):
        load_landmarker("fan", tmp_path)
    (tmp_path / FAN_WEIGHTS[0]).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=FAN_WEIGHTS[0].replace(".", r"\.")):
        load_landmarker("fan", tmp_path)
