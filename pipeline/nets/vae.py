"""VAE latents of the crops (precompile stage 6) and their decoding (musetalk renderer).

The VAE is diffusers' `AutoencoderKL` (MuseTalk uses `sd-vae-ft-mse`) loaded from a
directory under the models dir, never from a hub. Latents use the posterior's mode,
not a sample, so the same crops always give the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.nets.backends import files_digest
from pipeline.nets.models import vae_files


def load_vae(models_dir: Path | str | None, name: str) -> tuple[Any, str]:
    """(AutoencoderKL in eval mode, identity) from `models_dir/name`.

    The VAE runs in float16 on CUDA when there is one, float32 on the CPU. The
    identity is the digest of its config and weights that `backend_identity` (the stage
    keys) uses too.
    Raises what `vae_files` raises.
    """
    files = vae_files(models_dir, name)
    import torch
    from diffusers import AutoencoderKL

    # low_cpu_mem_usage=False: the fast path needs `accelerate`, and asks for it loudly
    vae = AutoencoderKL.from_pretrained(
        files[0].parent, local_files_only=True, low_cpu_mem_usage=False
    )
    if torch.cuda.is_available():
        vae = vae.to("cuda", dtype=torch.float16)
    vae.eval()
    return vae, files_digest(files)


def encode_latents(vae: Any, crops: np.ndarray, batch: int = 8) -> np.ndarray:
    """(B, 8, 32, 32) float16 latents of (B, 256, 256, 3) uint8 RGB crops.

    Channels 0-3: the crop with its lower half blanked (black, i.e. 0 before the
    [-1, 1] normalisation, as MuseTalk's `preprocess_img(half_mask=True)`);
    channels 4-7: the whole crop. This is MuseTalk's `get_latents_for_unet` order
    (masked first, reference second), which its UNet's 8 input channels expect.
    Each is `latent_dist.mode() * scaling_factor`.
    """
    import torch

    crops = np.asarray(crops)
    if crops.ndim != 4 or crops.shape[3] != 3 or crops.dtype != np.uint8:
        raise ValueError(f"crops are {crops.dtype} {crops.shape}; expected (B, H, W, 3) uint8")
    if batch < 1:
        raise ValueError(f"batch={batch} must be >= 1")
    device, dtype = vae.device, vae.dtype
    scale = float(vae.config.scaling_factor)
    half = crops.shape[1] // 2
    out = []
    with torch.inference_mode():
        for start in range(0, len(crops), batch):
            x = torch.from_numpy(np.array(crops[start : start + batch])).to(
                device
            )  # a copy: store arrays are read-only
            x = x.permute(0, 3, 1, 2).float() / 255.0
            masked = x.clone()
            masked[:, :, half:, :] = 0.0
            both = (torch.cat([masked, x]) * 2.0 - 1.0).to(dtype)
            lat = _runner(vae, "vae_encoder", both)(both) * scale
            lat_masked, lat_full = lat.chunk(2)
            out.append(torch.cat([lat_masked, lat_full], dim=1).to(torch.float16).cpu().numpy())
    if not out:
        return np.zeros((0, 8, crops.shape[1] // 8, crops.shape[2] // 8), np.float16)
    return np.concatenate(out)


def decode_latents(vae: Any, latents: Any, batch: int = 8) -> np.ndarray:
    """(B, 256, 256, 3) uint8 RGB from (B, 4, 32, 32) latents (numpy or torch),
    scaled as `encode_latents` stores them."""
    import torch

    lat = torch.as_tensor(np.asarray(latents) if isinstance(latents, np.ndarray) else latents)
    if lat.ndim != 4 or lat.shape[1] != vae.config.latent_channels:
        raise ValueError(
            f"latents have shape {tuple(lat.shape)}; expected (B, {vae.config.latent_channels}, h, w)"
        )
    scale = float(vae.config.scaling_factor)
    out = []
    with torch.inference_mode():
        for start in range(0, lat.shape[0], batch):
            # upstream MuseTalk's arithmetic, op for op (x * (1/s), clamp in the VAE's
            # dtype, round in float32), so that the same latents give the same bytes; the
            # decoder itself runs on cpu_speed's runtime (eager where parity is checked)
            chunk = (1 / scale) * lat[start : start + batch].to(vae.device, dtype=vae.dtype)
            img = (_runner(vae, "vae_decoder", chunk)(chunk) / 2 + 0.5).clamp(0, 1)
            img = (img.permute(0, 2, 3, 1).float() * 255).round().to(torch.uint8)
            out.append(img.cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0, 0, 3), np.uint8)


def latent_mode_module(vae: Any) -> Any:
    """torch module: images in [-1, 1] -> the posterior's mode (what `encode` + `.mode()`
    give, without the distribution object, so that other runtimes can take it)."""
    import torch

    class LatentMode(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.quant_conv = vae.encoder, vae.quant_conv

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.quant_conv(self.encoder(x))[:, : vae.config.latent_channels]

    return LatentMode().eval()


def decoder_module(vae: Any) -> Any:
    """torch module: unscaled latents -> images in [-1, 1] (`vae.decode(z).sample`)."""
    import torch

    class Decode(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.post_quant_conv, self.decoder = vae.post_quant_conv, vae.decoder

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return self.decoder(self.post_quant_conv(z))

    return Decode().eval()


def _runner(vae: Any, net: str, example: Any) -> Any:
    """The VAE half `net` run by `cpu_speed`'s chosen CPU runtime, made once per VAE."""
    from pipeline.nets.cpu_speed import cached_runner

    build = latent_mode_module if net == "vae_encoder" else decoder_module
    return cached_runner(vae, net, lambda: build(vae), (example[:1],))
