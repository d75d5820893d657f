import shutil

import numpy as np
import pytest

from hotplate.demo_data import write_wav
from pipeline.nets.models import ModelMissingError
from pipeline.render.renderers import load_renderer
from pipeline.render.renderers.musetalk import (
    MuseTalkRenderer,
    check_weights,
    feature_window,
    layer_slots,
    positional_encoding,
)
from pipeline.render.video import render_video
from testkit.render_fixtures import (
    build_assets,
    full_mask,
    read_video,
    save_tiny_musetalk_models,
    speech,
)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return save_tiny_musetalk_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def latents(models_dir):
    from pipeline.nets.vae import encode_latents, load_vae

    vae, _ = load_vae(models_dir, "sd-vae-ft-mse")
    return encode_latents(vae, np.array(build_assets(4).crops))  # writable copy for torch


def test_positional_encoding_is_musetalks():
    pe = positional_encoding(50)
    assert pe.shape == (50, 384) and pe.dtype == np.float32
    assert np.allclose(pe[0, 0::2], 0) and np.allclose(pe[0, 1::2], 1)
    assert pe[3, 2] == pytest.approx(np.sin(3 * np.exp(-2 * np.log(10000.0) / 384)), abs=1e-6)


def test_layer_slots_and_windows():
    assert layer_slots(5) == [0, 1, 2, 3, 4]  # whisper-tiny: embeddings + 4 layers
    assert layer_slots(7) == [2, 3, 4, 5, 6]
    assert layer_slots(2) == [0, 0, 0, 1, 1]
    assert layer_slots(1) == [0] * 5
    assert feature_window(0, 25) == (-4, 6)  # features 2t-4 .. 2t+5
    assert feature_window(10, 25) == (16, 26)


def test_missing_weights_name_every_file(tmp_path, models_dir):
    with pytest.raises(ModelMissingError, match="needs a models dir.*hotplate doctor"):
        check_weights(None)
    with pytest.raises(ModelMissingError) as err:
        load_renderer("musetalk", tmp_path)
    msg = str(err.value)
    for part in (
        "musetalkV15/musetalk.json",
        "musetalkV15/unet.pth",
        "musetalk/pytorch_model.bin",
        "musetalk/unet/config.json",
        "sd-vae must hold",  # upstream's VAE name is the default when none is complete
        "whisper/",
        "whisper-tiny/",
        "model.safetensors or pytorch_model.bin",
        "preprocessor_config.json",
        "hotplate doctor",
    ):
        assert part in msg
    partial = tmp_path / "partial"
    shutil.copytree(models_dir, partial)
    (partial / "whisper-tiny" / "model.safetensors").unlink()
    with pytest.raises(ModelMissingError, match="whisper-tiny/ lacks model.safetensors") as err:
        MuseTalkRenderer(partial)
    assert "unet" not in str(err.value)
    assert isinstance(err.value, FileNotFoundError)


def test_long_audio_is_encoded_in_30s_windows(models_dir):
    r = MuseTalkRenderer(models_dir)
    assets = build_assets(4, latents=np.zeros((4, 8, 32, 32), np.float16))
    audio = speech(31.0, 16000)
    r.prepare(assets, audio, 16000, 775, 25.0)
    feats = r._features
    assert feats.length == 1550
    span = feats.frames(1490, 1510)  # straddles the two windows
    assert span.shape == (20, 5, 384)
    assert sorted(feats._windows) == [0, 1]
    first, second = feats._window(0), feats._window(1)
    assert np.array_equal(span[:10].numpy(), first[1490:1500].numpy())
    assert np.array_equal(span[10:].numpy(), second[:10].numpy())
    assert np.abs(span.numpy()).sum() > 0
    feats.frames(1520, 1530)
    assert sorted(feats._windows) == [1]  # window 0 is done and dropped
    tail = feats.frames(1545, 1555)  # past the end of the audio: zeros
    assert np.abs(tail[5:].numpy()).sum() == 0
    tokens = r.audio_tokens([0, 1, 774])
    assert tuple(tokens.shape) == (3, 50, 384)
    assert np.abs(tokens[0, :20].numpy()).sum() == 0  # frame 0: features -4..-1 are padding


def test_latents_are_required(models_dir, tmp_path):
    wav = write_wav(tmp_path / "a.wav", speech(0.5, 16000), 16000)
    with pytest.raises(ValueError, match="no VAE latents.*--vae sd-vae-ft-mse"):
        render_video(
            build_assets(4), wav, tmp_path / "o.mp4", backend="musetalk", models_dir=models_dir
        )
    assert not (tmp_path / "o.mp4").exists()


def test_render_batch_shapes(models_dir, latents):
    assets = build_assets(4, latents=latents)
    r = load_renderer("musetalk", models_dir)
    r.prepare(assets, speech(1.0, 16000), 16000, 25, 25.0)
    frames = [assets.load_frame(i) for i in (0, 1, 2)]
    out = r.render_batch([0, 1, 2], [0, 1, 2], frames)
    assert len(out) == 3
    for got, stored, i in zip(out, frames, (0, 1, 2), strict=True):
        assert got.shape == stored.shape and got.dtype == np.uint8
        m = full_mask(assets, i)
        assert np.array_equal(got[m == 0], stored[m == 0])
        assert not np.array_equal(got, stored)  # the (random) UNet redrew the mouth


@pytest.mark.slow
def test_musetalk_end_to_end(models_dir, latents, tmp_path):
    assets = build_assets(4, latents=latents, fps=30.0)
    wav = write_wav(tmp_path / "a.wav", speech(2.0, 22050), 22050)
    report = render_video(
        assets, wav, tmp_path / "mt.mp4", backend="musetalk", models_dir=models_dir
    )
    assert report.fps == 25.0 and report.frames == 50 and report.backend == "musetalk"
    frames, info = read_video(report.out_path)
    assert info["video_codec"] == "h264" and info["audio_codec"] == "aac"
    assert (info["width"], info["height"]) == (assets.width, assets.height)
    assert abs(len(frames) - 50) <= 1 and abs(info["audio_seconds"] - 2.0) < 1 / 25
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav", "mt.mp4"]


def test_whisper_dtype_keyword_follows_transformers():
    from pipeline.render.renderers.musetalk import whisper_load_kwargs

    # `dtype=` is a TypeError on 4.40 (pyproject's floor), `torch_dtype=` is deprecated on 5.x
    assert whisper_load_kwargs("f16", "4.40.0") == {"torch_dtype": "f16"}
    assert whisper_load_kwargs("f16", "4.55.4") == {"torch_dtype": "f16"}
    assert whisper_load_kwargs("f16", "4.56.0") == {"dtype": "f16"}
    assert whisper_load_kwargs("f16", "5.24.0.dev0") == {"dtype": "f16"}
