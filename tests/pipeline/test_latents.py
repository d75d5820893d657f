import json

import numpy as np
import pytest

from pipeline.nets.models import ModelMissingError
from pipeline.nets.vae import decode_latents, encode_latents, load_vae


def tiny_vae(seed: int = 0):
    """AutoencoderKL with the SD VAE's shape (4 blocks = 3 downsamples, 4 latent
    channels: 256 -> 32x32) and tiny widths."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 16, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=256,
    )


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    tiny_vae().save_pretrained(models / "sd-vae-ft-mse")
    return models


@pytest.fixture(scope="module")
def crops():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (3, 256, 256, 3), dtype=np.uint8)


def test_load_encode_decode(models_dir, crops):
    vae, identity = load_vae(models_dir, "sd-vae-ft-mse")
    assert len(identity) == 32
    assert load_vae(models_dir, "sd-vae-ft-mse")[1] == identity  # stable across loads

    lat = encode_latents(vae, crops, batch=2)
    assert lat.shape == (3, 8, 32, 32) and lat.dtype == np.float16
    assert np.isfinite(lat).all()
    again = encode_latents(vae, crops, batch=2)
    assert lat.tobytes() == again.tobytes()  # mode(), not sample(): bit-equal

    img = decode_latents(vae, lat[:, 4:])
    assert img.shape == (3, 256, 256, 3) and img.dtype == np.uint8


def test_masked_latents_come_first(models_dir, crops):
    """Channels 0-3 see only the upper half (MuseTalk's order: masked, then full)."""
    vae, _ = load_vae(models_dir, "sd-vae-ft-mse")
    other = crops[:1].copy()
    other[:, 128:] = 255 - other[:, 128:]  # same upper half, different lower half
    a = encode_latents(vae, crops[:1])
    b = encode_latents(vae, other)
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert not np.array_equal(a[:, 4:], b[:, 4:])
    blank = crops[:1].copy()
    blank[:, 128:] = 0
    np.testing.assert_array_equal(encode_latents(vae, blank)[:, 4:], a[:, :4])


def test_identity_follows_the_weights(tmp_path, models_dir):
    tiny_vae(seed=1).save_pretrained(tmp_path / "sd-vae-ft-mse")
    assert load_vae(tmp_path, "sd-vae-ft-mse")[1] != load_vae(models_dir, "sd-vae-ft-mse")[1]


def test_missing_dir(tmp_path):
    with pytest.raises(ModelMissingError) as err:
        load_vae(tmp_path, "sd-vae-ft-mse")
    msg = str(err.value)
    assert str(tmp_path / "sd-vae-ft-mse") in msg
    assert "config.json" in msg and "diffusion_pytorch_model.safetensors" in msg
    assert "hotplate doctor" in msg


def test_missing_weights(tmp_path):
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL"}))
    with pytest.raises(ModelMissingError, match="diffusion_pytorch_model"):
        load_vae(tmp_path, "vae")


def test_no_models_dir_and_bad_names(tmp_path):
    with pytest.raises(ModelMissingError, match="models dir"):
        load_vae(None, "sd-vae-ft-mse")
    for bad in ("", "../elsewhere", "/abs/vae"):
        with pytest.raises(ValueError, match="vae="):
            load_vae(tmp_path, bad)


def test_bad_crops(models_dir):
    vae, _ = load_vae(models_dir, "sd-vae-ft-mse")
    with pytest.raises(ValueError, match="uint8"):
        encode_latents(vae, np.zeros((2, 256, 256, 3), np.float32))
    with pytest.raises(ValueError, match="latents"):
        decode_latents(vae, np.zeros((1, 8, 32, 32), np.float16))
