"""musetalk render speed at upstream's real network sizes, random weights, and each step's share.

    .venv/bin/python bench/bench_musetalk.py [--seconds 1] [--batch 20] [--device cpu]

Speed does not depend on the weights' values, so the networks are random at their real
sizes, saved in a models dir laid out as upstream's `models/` (musetalkV15/musetalk.json
and unet.pth, sd-vae/, whisper/) and loaded by `MuseTalkRenderer` as a user's would be:
the UNet from upstream's musetalk.json (SD 1.x's UNet with 8 input channels and
cross-attention 384, reconstructed below: the file is not in the snapshot), the
sd-vae-ft-mse AutoencoderKL and whisper-tiny. `--unet-width` and `--vae-width` narrow the
UNet and the VAE (the same architectures; --quick does). The avatar is 8 synthetic
1080x1920 frames with their crops and masks (testkit/render_fixtures.py's
build_assets) and random latents. It runs the renderer's own code path
(`MuseTalkRenderer.audio_tokens` and `.faces`, `paste_face`, Mp4Writer) on every frame
(speech throughout: the UNet draws each one), and records frames/s and each step's
seconds per frame: whisper, UNet + VAE decode (`faces`), of which VAE decode
(`decode_latents` on the renderer's VAE files, timed alone on one batch), blend, encode.
Figures only, no asserts; the baseline the GPU work is judged against.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from harness import Bench, run_bench, timed

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


def save_models(models: Path, unet_width: int, vae_width: int) -> int:
    """Random weights at (or, narrowed, below) upstream's sizes, in upstream's layout;
    returns the UNet's parameter count."""
    import json

    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperModel

    torch.manual_seed(0)
    w = unet_width
    config = {**MUSETALK_UNET, "block_out_channels": [w, 2 * w, 4 * w, 4 * w]}
    (models / "musetalkV15").mkdir(parents=True)
    (models / "musetalkV15" / "musetalk.json").write_text(json.dumps(config, indent=2))
    unet = UNet2DConditionModel(**config)
    params = sum(p.numel() for p in unet.parameters())
    # float16 on disk halves the 3.4 GB file; the loader casts into the float32 UNet
    state = {k: v.half() for k, v in unet.state_dict().items()}
    del unet
    torch.save(state, models / "musetalkV15" / "unet.pth")
    del state
    w0 = vae_width
    vae = {**SD_VAE, "block_out_channels": [w0, 2 * w0, 4 * w0, 4 * w0]}
    if w0 % 32:  # GroupNorm's 32 groups need channels that divide by them
        vae["norm_num_groups"] = w0 // 2
    AutoencoderKL(**vae).save_pretrained(models / "sd-vae")
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
    tiny.save_pretrained(models / "whisper")
    torch.save(WhisperModel(tiny).state_dict(), models / "whisper" / "pytorch_model.bin")
    WhisperFeatureExtractor(feature_size=80).save_pretrained(models / "whisper")
    return params


def add_arguments(ap) -> None:
    ap.add_argument("--seconds", type=float, default=1.0, help="audio length (25 frames/s)")
    ap.add_argument("--batch", type=int, default=20, help="UNet batch (upstream's 20)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--unet-width", type=int, default=320, help="UNet first block (320: real)")
    ap.add_argument("--vae-width", type=int, default=128, help="SD-VAE first block (128: real)")


def main(bench: Bench) -> None:
    import torch

    from hotplate.demo_data import make_speech_audio as speech
    from pipeline.nets.vae import decode_latents, load_vae
    from pipeline.render.encode import Mp4Writer
    from pipeline.render.renderers.musetalk import MuseTalkRenderer, paste_face
    from testkit.render_fixtures import FULL, build_assets

    args = bench.args
    print(f"torch threads: {torch.get_num_threads()}; device {args.device}")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        models = Path(tmp) / "models"
        params = save_models(models, args.unet_width, args.vae_width) / 1e6
        audio = speech(args.seconds, 16000)
        n = int(args.seconds * 25)
        rng = np.random.default_rng(0)
        latents = rng.normal(0, 1, (8, 8, 32, 32)).astype(np.float16)
        assets = build_assets(8, FULL, latents=latents)
        r = MuseTalkRenderer(models, device=args.device, batch_size=args.batch)
        try:
            r.prepare(assets, audio, 16000, n, 25.0)
        except ValueError as e:  # --device cuda on a machine without one, ...
            bench.missing(str(e))
        print(f"setup {time.perf_counter() - t0:.1f} s; UNet {params:.0f} M parameters")
        # the first batch converts the UNet and the decoder for the CPU runtime (cached on
        # disk after): a one-off a warm worker has behind it, so timed on its own
        convert_s, _ = timed(lambda: r.faces([0], [0]))

        steps = dict.fromkeys(("whisper", "unet + vae decode", "blend", "encode"), 0.0)
        start = time.perf_counter()
        t = time.perf_counter()
        r.audio_tokens([n - 1])  # encodes the audio's Whisper window(s)
        steps["whisper"] += time.perf_counter() - t
        with Mp4Writer(
            Path(tmp) / "out.mp4", FULL[0], FULL[1], 25, audio=audio.astype(np.float32)
        ) as w:
            for b in range(0, n, args.batch):
                ts = list(range(b, min(n, b + args.batch)))
                idxs = [i % assets.n_frames for i in ts]
                t = time.perf_counter()
                faces = r.faces(ts, idxs)
                steps["unet + vae decode"] += time.perf_counter() - t
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
        # VAE decode alone: the renderer's function on its VAE files, one batch of latents
        vae, _ = load_vae(models, "sd-vae")
        vae = vae.to(r.device, r.dtype).eval()
        k = min(n, args.batch)
        lat = torch.from_numpy(rng.normal(0, 1, (k, 4, 32, 32)).astype(np.float32))
        decode_latents(vae, lat[:1], batch=1)  # the runtime's conversion, as faces() made it
        t = time.perf_counter()
        decode_latents(vae, lat, batch=k)
        decode_each = (time.perf_counter() - t) / k
        inputs = {
            "loop_frames": assets.n_frames,
            "resolution": f"{FULL[0]}x{FULL[1]}",
            "audio_seconds": args.seconds,
            "renderer": "musetalk",
            "batch": args.batch,
            "device": str(r.device),
            "dtype": str(r.dtype).removeprefix("torch."),
            "unet_width": args.unet_width,
            "vae_width": args.vae_width,
        }
        shares = {**steps, "other": total - sum(steps.values())}
        bench.figure(
            "musetalk render, random weights at upstream's sizes",
            n / total,
            "frames/s",
            baseline="real time (25 frames/s)",
            baseline_value=25.0,
            inputs=inputs,
            note=f"UNet {params:.0f} M parameters; "
            + ", ".join(f"{name} {100 * v / total:.1f}%" for name, v in shares.items()),
        )
        for name, seconds in shares.items():
            bench.figure(
                f"musetalk render, per frame: {name}",
                seconds / n,
                "s",
                baseline="the whole frame",
                baseline_value=total / n,
                better="lower",
                inputs=inputs,
            )
        bench.figure(
            "musetalk: the first batch of one frame, with the CPU runtime's one-off conversion",
            convert_s,
            "s",
            baseline="UNet + VAE decode (faces) per frame, converted",
            baseline_value=steps["unet + vae decode"] / n,
            better="lower",
            inputs=inputs,
            note="cached on disk afterwards; a warm worker has it behind it",
        )
        bench.figure(
            "musetalk render, per frame: VAE decode alone (one batch)",
            decode_each,
            "s",
            baseline="UNet + VAE decode (faces) per frame",
            baseline_value=steps["unet + vae decode"] / n,
            better="lower",
            inputs=inputs,
        )


if __name__ == "__main__":
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={"seconds": 0.12, "batch": 3, "unet_width": 32, "vae_width": 16},
    )
