"""The CPU runtimes the pipeline uses keep the numbers: latents within 2e-2 relative error
of the float32 reference and decoded crops within 2/255 mean absolute error (small random
models of the real architectures' shapes)."""

import numpy as np
import pytest

from pipeline.nets.cpu_speed import (
    CHOSEN,
    RUNTIMES,
    cached_runner,
    cpu_runner,
    fast_cpu_runner,
    runtime_available,
    unet_module,
)
from pipeline.nets.vae import decode_latents, decoder_module, encode_latents, latent_mode_module
from testkit.render_fixtures import TINY_UNET
from tests.pipeline.test_latents import tiny_vae

LATENT_TOL, PIXEL_TOL = 2e-2, 2.0

# the runtimes the pipeline uses, plus ONNX Runtime as the other exported path
USED = sorted({r for r in CHOSEN.values() if runtime_available(r)} | {"eager"})


def rel_err(a, b) -> float:
    a = [a] if not isinstance(a, list) else a
    b = [b] if not isinstance(b, list) else b
    num = sum(float(((x.float() - y.float()) ** 2).sum()) for x, y in zip(a, b, strict=True))
    return (num / sum(float((y.float() ** 2).sum()) for y in b)) ** 0.5


def to_uint8(img) -> np.ndarray:
    return ((img.float() / 2 + 0.5).clamp(0, 1) * 255).round().byte().numpy()


@pytest.fixture(scope="module")
def vae():
    return tiny_vae().eval()


@pytest.fixture(scope="module")
def images():
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.rand(3, 3, 256, 256, generator=g) * 2 - 1


@pytest.mark.parametrize("runtime", USED)
def test_latents_and_decoded_crops_within_bounds(vae, images, runtime):
    import torch

    with torch.inference_mode():
        ref = vae.encode(images).latent_dist.mode()
        ref_img = to_uint8(vae.decode(ref).sample)
    encode = cpu_runner(latent_mode_module(vae), (images[:1],), runtime)
    decode = cpu_runner(decoder_module(vae), (ref[:1],), runtime)
    lat = encode(images)  # batch 3 after an example of 1: a new shape
    assert lat.shape == ref.shape
    assert rel_err(lat, ref) <= LATENT_TOL
    assert np.abs(to_uint8(decode(lat)).astype(int) - ref_img).mean() <= PIXEL_TOL


def test_encode_latents_matches_diffusers(vae):
    """The production path (CHOSEN runtime) against diffusers' own encode, float32."""
    import torch

    rng = np.random.default_rng(1)
    crops = rng.integers(0, 256, (2, 256, 256, 3), dtype=np.uint8)
    lat = encode_latents(vae, crops, batch=2).astype(np.float32)
    x = torch.from_numpy(crops).permute(0, 3, 1, 2).float() / 255.0
    masked = x.clone()
    masked[:, :, 128:] = 0
    with torch.inference_mode():
        scale = vae.config.scaling_factor
        want = [vae.encode(v * 2 - 1).latent_dist.mode() * scale for v in (masked, x)]
    assert rel_err(torch.from_numpy(lat), torch.cat(want, dim=1)) <= LATENT_TOL
    with torch.inference_mode():
        want_img = to_uint8(vae.decode(want[1] / scale).sample).transpose(0, 2, 3, 1)
    got_img = decode_latents(vae, lat[:, 4:])
    assert np.abs(got_img.astype(int) - want_img).mean() <= PIXEL_TOL


@pytest.mark.parametrize("runtime", USED)
def test_unet_within_bounds(runtime):
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(**TINY_UNET).eval()
    g = torch.Generator().manual_seed(1)
    lat, ctx = torch.randn(2, 8, 32, 32, generator=g), torch.randn(2, 50, 384, generator=g)
    t0 = torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        ref = unet(lat, t0, encoder_hidden_states=ctx).sample
    run = cpu_runner(unet_module(unet), (lat[:1], t0, ctx[:1]), runtime)
    assert rel_err(run(lat, t0, ctx), ref) <= LATENT_TOL


@pytest.mark.parametrize("runtime", USED)
def test_s3fd_and_bisenet_within_bounds(runtime):
    import torch
    from face_alignment.detection.sfd.net_s3fd import s3fd

    from pipeline.nets.bisenet import build_bisenet

    torch.manual_seed(0)
    for net, shape in ((s3fd(), (2, 3, 96, 128)), (build_bisenet(), (2, 3, 64, 64))):
        net = net.eval()
        x = torch.randn(*shape)
        with torch.inference_mode():
            ref = net(x)
        ref = list(ref) if isinstance(ref, list | tuple) else ref
        out = cpu_runner(net, (x[:1],), runtime)(x)
        assert rel_err(out, ref) <= LATENT_TOL


def test_cached_runner_is_made_once_per_model(vae, images):
    built = []

    def build():
        built.append(1)
        return latent_mode_module(vae)

    owner = type("Owner", (), {})()
    a = cached_runner(owner, "vae_encoder", build, (images[:1],))
    b = cached_runner(owner, "vae_encoder", build, (images[:1],))
    assert a is b and len(built) == 1


def test_unknown_runtime_and_fallback(vae, images):
    with pytest.raises(ValueError, match="unknown CPU runtime 'fast'"):
        runtime_available("fast")
    assert set(CHOSEN.values()) <= set(RUNTIMES)
    # a net with no choice runs eager, i.e. exactly the module
    run = fast_cpu_runner(latent_mode_module(vae), (images[:1],), "not-a-net")
    import torch

    with torch.inference_mode():
        assert torch.equal(run(images[:1]), latent_mode_module(vae)(images[:1]))


@pytest.mark.skipif(not runtime_available("openvino"), reason="openvino not installed")
def test_openvino_conversion_is_kept_on_disk(tmp_path, monkeypatch):
    import torch

    from pipeline.nets.bisenet import build_bisenet

    monkeypatch.setenv("HOTPLATE_CPU_CACHE", str(tmp_path))
    torch.manual_seed(0)
    net, x = build_bisenet().eval(), torch.randn(1, 3, 64, 64)
    first = cpu_runner(net, (x,), "openvino")(x)
    # one converted model, a folder holding its pair, no leftover .part folder
    (kept,) = tmp_path.iterdir()
    assert kept.suffix == ".openvino"
    assert sorted(p.name for p in kept.iterdir()) == ["model.bin", "model.xml"]
    assert torch.equal(cpu_runner(net, (x,), "openvino")(x), first)  # read back, same numbers
    with torch.no_grad():
        net.conv_out.conv_out.weight.mul_(2)  # other weights: another entry, not a stale hit
    cpu_runner(net, (x,), "openvino")(x)
    assert len(list(tmp_path.glob("*.openvino/model.xml"))) == 2
