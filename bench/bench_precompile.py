"""Precompile: hotplate's musetalk recipe against upstream MuseTalk's preprocessing.

    .venv/bin/python bench/bench_precompile.py [--video PATH] [--frames 150]
        [--sample 1] [--hot-frames 12] [--crops 2]

Random-init weights of the real architectures in a models dir laid out as the real one
(S3FD, DWPose's RTMPose-l, BiSeNet, the sd-vae-ft-mse AutoencoderKL): speed does not
depend on the weights. On one loop (`--video PATH`, default a generated `--size` one):

  upstream  MuseTalk's preprocessing, per frame: S3FD on the full-resolution frame, 68
            points from DWPose (hotplate's port, as `--landmarks dwpose` runs it), BiSeNet
            face parsing, VAE latents in float32 eager (upstream's code path). Too slow to
            run whole here, so each stage is timed on `--sample` frames and scaled to all;
            decoding is timed on every frame.
  hotplate  `pipeline.precompile.run.precompile` with the recipe a musetalk render
            precompiles under (`for_backend(..., "musetalk")`: s3fd, dwpose, bisenet,
            sd-vae-ft-mse) into a fresh store, on the first `--hot-frames` frames, each
            stage scaled linearly to all frames. Models are loaded (and converted for the
            CPU runtime) once before, as a warm watcher or service has them; that one-off
            cost is recorded on its own.

Then precompile seconds per 150 frames at 1080x1920 with each stage's share, and the
latents stage before (today's eager float32) and after `pipeline.nets.cpu_speed`, on the
same `--crops` crops. Prints figures; asserts nothing. Both sides of every ratio run in this
one process, one after the other, so a shared machine loads both.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from harness import Bench, run_bench

from bench.bench_cpu_speed import SD_VAE, face_crops
from cachestore.store import open_store
from hotplate import demo_data as synthetic
from pipeline.media import iter_frames
from pipeline.nets.cpu_speed import RUNTIME_ENV
from pipeline.precompile.recipe import Recipe, for_backend

LANDMARKS = "dwpose"  # upstream MuseTalk's 68 points


def save_random_models(models: Path, vae_config: dict) -> None:
    """Untrained weights of the real architectures, under the file names (and, for
    DWPose, the mmengine checkpoint layout) the loaders look for."""
    import torch
    from diffusers import AutoencoderKL
    from face_alignment.detection.sfd.net_s3fd import s3fd

    from pipeline.nets import dwpose
    from pipeline.nets.backends import weight_names
    from pipeline.nets.bisenet import build_bisenet

    torch.manual_seed(0)
    models.mkdir(parents=True, exist_ok=True)
    files = {
        "s3fd": (models / weight_names("detector", "s3fd")[0], s3fd().state_dict()),
        "bisenet": (models / weight_names("mask", "bisenet")[0], build_bisenet().state_dict()),
        "dwpose": (
            models / weight_names("landmarks", LANDMARKS)[0],
            {"meta": {}, "state_dict": dwpose.build_network().state_dict()},
        ),
    }
    for path, state in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, path)
    torch.manual_seed(0)  # the same VAE as bench_cpu_speed's: its CPU conversion is reused
    AutoencoderKL(**vae_config).save_pretrained(models / "sd-vae-ft-mse")


def upstream_per_frame(
    frames: list[np.ndarray], models: Path, landmarks: str, sample: int
) -> dict[str, float]:
    """Seconds per frame of each upstream stage, timed on `sample` evenly spaced frames."""
    from pipeline.nets.detectors import load_detector
    from pipeline.nets.landmarks import load_landmarker
    from pipeline.nets.vae import encode_latents, load_vae
    from pipeline.precompile.crops import crop_resize, half_face_box
    from pipeline.precompile.masks import bisenet_mask, blend_square, load_face_parser

    os.environ[RUNTIME_ENV] = "eager"  # upstream runs its networks in plain float32 torch
    try:
        detector = load_detector("s3fd", models)
        landmarker = load_landmarker(landmarks, models)
        parser = load_face_parser("bisenet", models)
        vae, _ = load_vae(models, "sd-vae-ft-mse")
        picks = np.linspace(0, len(frames) - 1, sample).round().astype(int)
        spent = dict.fromkeys(("s3fd full-res", f"{landmarks} 68 points", "bisenet", "vae"), 0.0)
        for i in picks:
            frame = frames[i]
            t = time.perf_counter()
            dets = detector.detect([frame])[0]
            spent["s3fd full-res"] += time.perf_counter() - t
            h, w = frame.shape[:2]
            box = dets[0, :4] if len(dets) else np.array([w * 0.3, h * 0.3, w * 0.7, h * 0.6])
            t = time.perf_counter()
            lm = landmarker.predict(frame, box.astype(np.float32))
            spent[f"{landmarks} 68 points"] += time.perf_counter() - t
            crop_box = half_face_box(lm, 0, frame.shape, box)
            crop = crop_resize(frame, crop_box)
            t = time.perf_counter()
            bisenet_mask(parser, frame, crop_box, blend_square(crop_box))
            spent["bisenet"] += time.perf_counter() - t
            t = time.perf_counter()
            encode_latents(vae, crop[None])
            spent["vae"] += time.perf_counter() - t
    finally:
        os.environ.pop(RUNTIME_ENV, None)
    return {k: v / len(picks) for k, v in spent.items()}


def hotplate_stages(video: Path, recipe: Recipe, tmp: Path) -> tuple[dict[str, float], float]:
    """Stage seconds of a precompile into a fresh store, after a warm-up that loads (and
    converts) the models; returns (stages, warm-up seconds)."""
    from pipeline.precompile.run import precompile

    warm = synthetic.write_loop_video(
        tmp / "warm.mp4", (f for i, f in enumerate(iter_frames(video)) if i < 8)
    )
    start = time.perf_counter()
    precompile(warm, recipe, open_store(tmp / "warm-store"))
    warm_s = time.perf_counter() - start
    report = precompile(video, recipe, open_store(tmp / "store"))
    return {s.name: s.seconds for s in report.stages}, warm_s


def latents_before_after(models: Path, crops: np.ndarray) -> tuple[float, float, float]:
    """crops/s of encode_latents with eager float32 (today) and with cpu_speed's choice,
    and the relative error between them."""
    from pipeline.nets.vae import encode_latents, load_vae

    rates, outs = [], []
    for runtime in ("eager", None):
        if runtime:
            os.environ[RUNTIME_ENV] = runtime
        try:
            vae, _ = load_vae(models, "sd-vae-ft-mse")
            encode_latents(vae, crops[:2], batch=8)  # warm-up (and conversion, for some)
            encode_latents(vae, crops, batch=8)  # the batch shape, compiled
            start = time.perf_counter()
            outs.append(encode_latents(vae, crops, batch=8).astype(np.float32))
            rates.append(len(crops) / (time.perf_counter() - start))
        finally:
            os.environ.pop(RUNTIME_ENV, None)
    err = float(np.linalg.norm(outs[1] - outs[0]) / np.linalg.norm(outs[0]))
    return rates[0], rates[1], err


def add_arguments(ap) -> None:
    ap.add_argument("--video", type=Path, help="a video to precompile (default: a generated loop)")
    ap.add_argument("--frames", type=int, default=150, help="frames of the generated loop")
    ap.add_argument("--size", default="1080x1920", help="WxH of the generated loop")
    ap.add_argument("--sample", type=int, default=1, help="frames timed on the upstream side")
    ap.add_argument("--hot-frames", type=int, default=12, help="frames hotplate precompiles")
    ap.add_argument("--crops", type=int, default=2, help="crops for latents before/after")
    ap.add_argument(
        "--vae-width",
        type=int,
        default=128,
        help="the SD-VAE's first block width (128: sd-vae-ft-mse; --quick: 16, the same "
        "architecture narrowed, so its CPU conversion takes seconds)",
    )


def main(bench: Bench) -> None:
    args = bench.args
    warnings.filterwarnings("ignore")
    w0 = args.vae_width
    vae_config = {**SD_VAE, "block_out_channels": (w0, 2 * w0, 4 * w0, 4 * w0)}
    if w0 % 32:  # GroupNorm's 32 groups need channels that divide by them
        vae_config["norm_num_groups"] = w0 // 2
    size = tuple(int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        models = tmp / "models"
        save_random_models(models, vae_config)
        landmarks = LANDMARKS
        video = args.video or synthetic.write_loop_video(
            tmp / "loop.mp4", n_frames=args.frames, size=size, motion="gentle"
        )
        start = time.perf_counter()
        frames = list(iter_frames(video))
        decode_s = time.perf_counter() - start
        n, (h, w) = len(frames), frames[0].shape[:2]
        print(
            f"{n} frames of {w}x{h} ({'--video' if args.video else 'generated loop'}); "
            f"landmarks backend: {landmarks}; random-init weights of the real architectures "
            f"(SD-VAE width {w0})"
        )

        per_frame = upstream_per_frame(frames, models, landmarks, args.sample)
        upstream = {"decode": decode_s, **{k: v * n for k, v in per_frame.items()}}
        up_total = sum(upstream.values())
        print(
            f"\nupstream MuseTalk preprocessing (every stage on every frame, float32 eager); "
            f"networks timed on {args.sample} of {n} frames and scaled x{n / args.sample:.0f}:"
        )
        for name, s in upstream.items():
            print(f"   {name:22} {s:9.1f} s  ({s / n:.2f} s/frame)")
        print(f"   {'total':22} {up_total:9.1f} s")

        m = min(args.hot_frames, n)
        clip = synthetic.write_loop_video(tmp / "clip.mp4", frames[:m])
        recipe = for_backend(Recipe(max_frames=0, models_dir=models), "musetalk")
        if (recipe.detector, recipe.landmarks, recipe.mask, recipe.vae) != (
            "s3fd",
            landmarks,
            "bisenet",
            "sd-vae-ft-mse",
        ):
            raise SystemExit(f"the musetalk recipe changed: {recipe}; update this bench")
        stages, warm_s = hotplate_stages(clip, recipe, tmp)
        hot = {k: v * n / m for k, v in stages.items()}
        hot_total = sum(hot.values())
        print(
            f"\nhotplate precompile, musetalk recipe, measured on {m} frames and scaled "
            f"x{n / m:.1f} (one-off model load + conversion before it: {warm_s:.0f} s, not counted):"
        )
        for name, s in hot.items():
            print(f"   {name:22} {s:9.1f} s  {100 * s / hot_total:5.1f}%")
        print(f"   {'total':22} {hot_total:9.1f} s")
        inputs = {
            "loop_frames": n,
            "resolution": f"{w}x{h}",
            "recipe": "musetalk (s3fd, dwpose, bisenet, sd-vae-ft-mse)",
            "hot_frames_measured": m,
            "upstream_frames_timed": args.sample,
            "vae_width": w0,
        }
        shares = ", ".join(f"{k} {100 * v / hot_total:.0f}%" for k, v in hot.items())
        bench.figure(
            "precompile, musetalk recipe, scaled to the whole loop",
            hot_total,
            "s",
            baseline="upstream MuseTalk's preprocessing, every network on every frame, "
            "float32 eager (scaled from the frames timed)",
            baseline_value=up_total,
            better="lower",
            inputs=inputs,
            note=shares,
        )
        bench.figure(
            "one-off model load and CPU conversion before the precompile",
            warm_s,
            "s",
            inputs={"vae_width": w0},
            note="a warm watcher or server pays it once; not in the figure above",
        )

        crops = face_crops(args.crops)
        before, after, err = latents_before_after(models, crops)
        bench.figure(
            "latents stage, VAE encoder 256x256 with pipeline.nets.cpu_speed's runtime",
            after,
            "crops/s",
            baseline="today's encode_latents, eager float32, same crops",
            baseline_value=before,
            inputs={"crops": args.crops, "vae_width": w0},
            note=f"rel err {err:.1e}; goal >= 3x",
        )


if __name__ == "__main__":
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={
            "frames": 2,
            "size": "270x480",
            "hot_frames": 1,
            "crops": 1,
            "vae_width": 16,
        },
    )
