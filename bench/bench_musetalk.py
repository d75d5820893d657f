"""musetalk render speed at upstream's real network sizes, random weights, and each step's share.

    .venv/bin/python bench/bench_musetalk.py [--seconds 1] [--batch 20] [--device cpu]

Speed does not depend on the weights' values, so the networks are random at their real
sizes: the UNet from upstream's musetalk.json (SD 1.x's UNet with 8 input channels and
cross-attention 384, reconstructed below: the file is not in the snapshot), the
sd-vae-ft-mse AutoencoderKL and whisper-tiny's encoder. Frames are 1080x1920 from
`hotplate.demo_data`. It runs the renderer's own code path (`MuseTalkRenderer.faces`,
`paste_face`, Mp4Writer) and prints frames/s and the seconds and share of each step:
whisper, UNet, VAE decode, blend, encode. Figures only, no asserts; the baseline the
GPU work is judged against.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# upstream models/musetalkV15/musetalk.json (and v1.0's; same architecture)
MUSETALK_UNET = {
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 384,
    "down_block_types": [
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "DownBlock2D",
    ],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 8,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": [
        "UpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
    ],
}
SD_VAE = {  # stabilityai/sd-vae-ft-mse config.json
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "latent_channels": 4,
    "norm_num_groups": 32,
    "sample_size": 256,
}


def real_size_models(device, dtype):
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import WhisperConfig, WhisperModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(**MUSETALK_UNET).to(device, dtype).eval()
    vae = AutoencoderKL(**SD_VAE).to(device, dtype).eval()
    tiny = WhisperConfig(  # openai/whisper-tiny
        d_model=384,
        encoder_layers=4,
        encoder_attention_heads=6,
        encoder_ffn_dim=1536,
        decoder_layers=4,
        decoder_attention_heads=6,
        decoder_ffn_dim=1536,
        num_mel_bins=80,
    )
    whisper = WhisperModel(tiny).get_encoder().to(device, dtype).eval()
    return unet, vae, whisper


def timed(steps: dict[str, float], name: str, fn):
    """`fn`, adding the seconds each call takes to steps[name]."""

    def wrapper(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        steps[name] += time.perf_counter() - t
        return out

    return wrapper


def main() -> None:
    import torch

    from pipeline.render.encode import Mp4Writer
    from pipeline.render.renderers.musetalk import MuseTalkRenderer, _WhisperFeatures, paste_face
    from tests.pipeline.parity_fixtures import save_upstream_models
    from tests.pipeline.render_fixtures import FULL, build_assets, speech

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="audio length (25 frames/s)")
    ap.add_argument("--batch", type=int, default=20, help="UNet batch (upstream's 20)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    print(
        f"cores: {os.cpu_count()}; torch threads: {torch.get_num_threads()}; "
        f"load average: {os.getloadavg()[0]:.1f}; device {args.device}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        models = save_upstream_models(Path(tmp) / "models")  # tiny: the layout the renderer loads
        audio = speech(args.seconds, 16000)
        n = int(args.seconds * 25)
        assets = build_assets(8, FULL, latents=np.zeros((8, 8, 32, 32), np.float16))
        r = MuseTalkRenderer(models, device=args.device, batch_size=args.batch)
        r.prepare(assets, audio, 16000, n, 25.0)
        # the same renderer, its networks swapped for random ones at upstream's real sizes
        r._unet, r._vae, r._whisper = real_size_models(r.device, r.dtype)
        r._features = _WhisperFeatures(r._whisper, r._extractor, audio, r.device, r.dtype)
        rng = np.random.default_rng(0)
        assets.latents = rng.normal(0, 1, (8, 8, 32, 32)).astype(np.float16)
        params = sum(p.numel() for p in r._unet.parameters()) / 1e6
        print(f"setup {time.perf_counter() - t0:.1f} s; UNet {params:.0f} M parameters")

        steps = dict.fromkeys(("whisper", "unet", "vae decode", "blend", "encode"), 0.0)
        start = time.perf_counter()
        t = time.perf_counter()
        r.audio_tokens([n - 1])  # encodes the audio's Whisper window(s)
        steps["whisper"] += time.perf_counter() - t
        r._unet.forward = timed(steps, "unet", r._unet.forward)
        r._vae.decode = timed(steps, "vae decode", r._vae.decode)
        with Mp4Writer(
            Path(tmp) / "out.mp4", FULL[0], FULL[1], 25, audio=audio.astype(np.float32)
        ) as w:
            for b in range(0, n, args.batch):
                ts = list(range(b, min(n, b + args.batch)))
                idxs = [i % assets.n_frames for i in ts]
                faces = r.faces(ts, idxs)
                for face, i in zip(faces, idxs, strict=True):
                    t = time.perf_counter()
                    frame = paste_face(
                        assets.load_frame(i),
                        face,
                        assets.crop_boxes[i],
                        assets.masks[i],
                        assets.mask_boxes[i],
                    )
                    steps["blend"] += time.perf_counter() - t
                    t = time.perf_counter()
                    w.write(frame)
                    steps["encode"] += time.perf_counter() - t
                print(f"  {ts[-1] + 1}/{n} frames, {time.perf_counter() - start:.1f} s", flush=True)
            t = time.perf_counter()
        steps["encode"] += time.perf_counter() - t
        total = time.perf_counter() - start
        print(
            f"\nmusetalk render, {n} frames 1080x1920 at upstream's real network sizes, "
            f"batch {args.batch}, {r.dtype} on {r.device}: {n / total:.3f} frames/s, "
            f"{total / n:.1f} s a frame ({n / total / 25:.4f}x real time; real time = 25 frames/s)"
        )
        for name, seconds in steps.items():
            print(f"  {name:11s} {seconds:7.2f} s  {seconds / total * 100:5.1f} %")
        other = total - sum(steps.values())
        print(f"  {'other':11s} {other:7.2f} s  {other / total * 100:5.1f} %")


if __name__ == "__main__":
    main()
