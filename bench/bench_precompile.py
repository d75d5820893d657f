"""Precompile: hotplate's musetalk recipe against upstream MuseTalk's preprocessing.

    .venv/bin/python bench/bench_precompile.py [--video PATH] [--frames 150]
        [--sample 1] [--hot-frames 12] [--crops 2]

Random-init weights of the real architectures in a models dir laid out as the real one
(S3FD, 2D-FAN or DWPose, BiSeNet, the sd-vae-ft-mse AutoencoderKL): speed does not depend
on the weights. On one 1080x1920 loop (`--video PATH`, default a generated one):

  upstream  MuseTalk's preprocessing, per frame: S3FD on the full-resolution frame, 68
            points (DWPose if the "dwpose" landmarks backend imports, else FAN), BiSeNet
            face parsing, VAE latents in float32 eager (upstream's code path). Too slow to
            run whole here, so each stage is timed on `--sample` frames and scaled to all;
            decoding is timed on every frame.
  hotplate  `pipeline.precompile.run.precompile` with the musetalk recipe (s3fd, the same
            landmarks backend, bisenet, sd-vae-ft-mse) into a fresh store, on the first
            `--hot-frames` frames, each stage scaled linearly to all frames. Models are
            loaded (and converted for the CPU runtime) once before, as a warm watcher or
            service has them; that one-off cost is printed on its own.

Then precompile seconds per 150 frames at 1080x1920 with each stage's share, and the
latents stage before (today's eager float32) and after `pipeline.nets.cpu_speed`, on the
same `--crops` crops. Prints figures; asserts nothing. Both sides of every ratio run in this
one process, one after the other, so a shared machine loads both.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_cpu_speed import SD_VAE, face_crops  # noqa: E402
from cachestore.store import open_store  # noqa: E402
from hotplate import demo_data as synthetic  # noqa: E402
from pipeline.media import iter_frames  # noqa: E402
from pipeline.nets.cpu_speed import RUNTIME_ENV  # noqa: E402
from pipeline.precompile.recipe import Recipe  # noqa: E402


def save_random_models(models: Path) -> None:
    """Untrained weights of the real architectures, under the real file names."""
    import torch
    from diffusers import AutoencoderKL
    from face_alignment.detection.sfd.net_s3fd import s3fd
    from face_alignment.models import FAN

    from pipeline.nets.bisenet import build_bisenet
    from pipeline.nets.detectors.s3fd import WEIGHTS as S3FD_WEIGHTS
    from pipeline.nets.landmarks import FAN_WEIGHTS
    from pipeline.precompile.masks import BISENET_WEIGHTS

    torch.manual_seed(0)
    models.mkdir(parents=True, exist_ok=True)
    torch.save(s3fd().state_dict(), models / S3FD_WEIGHTS[0])
    torch.save(FAN(4).state_dict(), models / FAN_WEIGHTS[0])
    torch.save(build_bisenet().state_dict(), models / BISENET_WEIGHTS[0])
    torch.manual_seed(0)  # the same VAE as bench_cpu_speed's: its CPU conversion is reused
    AutoencoderKL(**SD_VAE).save_pretrained(models / "sd-vae-ft-mse")


def landmarks_backend(models: Path) -> str:
    """dwpose when that backend exists here (random weights saved for it), else fan."""
    from pipeline.precompile import recipe

    if "dwpose" not in recipe.LANDMARKERS:
        return "fan"
    try:
        from pipeline.nets import dwpose  # type: ignore[attr-defined]

        dwpose.save_random_weights(models)  # type: ignore[attr-defined]
        return "dwpose"
    except Exception as e:  # the port is another helper's; fall back, and say so
        print(f"(dwpose backend not usable here: {type(e).__name__}: {e}; using fan)")
        return "fan"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--video", type=Path, help="a video to precompile (default: a generated loop)")
    ap.add_argument("--frames", type=int, default=150, help="frames of the generated loop")
    ap.add_argument("--sample", type=int, default=1, help="frames timed on the upstream side")
    ap.add_argument("--hot-frames", type=int, default=12, help="frames hotplate precompiles")
    ap.add_argument("--crops", type=int, default=2, help="crops for latents before/after")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        models = tmp / "models"
        save_random_models(models)
        landmarks = landmarks_backend(models)
        video = args.video or synthetic.write_loop_video(
            tmp / "loop.mp4", n_frames=args.frames, motion="gentle"
        )
        start = time.perf_counter()
        frames = list(iter_frames(video))
        decode_s = time.perf_counter() - start
        n, (h, w) = len(frames), frames[0].shape[:2]
        print(
            f"{n} frames of {w}x{h} ({'--video' if args.video else 'generated loop'}); "
            f"landmarks backend: {landmarks}; random-init weights of the real architectures; "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
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
        recipe = Recipe(
            max_frames=0,
            detector="s3fd",
            landmarks=landmarks,
            mask="bisenet",
            vae="sd-vae-ft-mse",
            models_dir=models,
        )
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
        print(f"\nend to end, upstream / hotplate: {up_total / hot_total:.1f}x")
        scale = 150 / n * (1920 * 1080) / (w * h)
        print(
            f"precompile seconds per 150 frames at 1080x1920 (scaled by frames and pixels): "
            f"{hot_total * scale:.0f} s (upstream {up_total * scale:.0f} s); shares: "
            + ", ".join(f"{k} {100 * v / hot_total:.0f}%" for k, v in hot.items())
        )

        crops = face_crops(args.crops)
        before, after, err = latents_before_after(models, crops)
        print(
            f"latents stage before (eager float32, today) {before:.2f} crops/s, after "
            f"(cpu_speed) {after:.2f} crops/s: {after / before:.2f}x, rel err {err:.1e}; per 150 "
            f"frames {150 / before:.0f} s -> {150 / after:.0f} s"
        )


if __name__ == "__main__":
    main()
