"""Precompile against a per-frame pipeline. Run: python bench/bench_precompile.py

On one 150-frame 1080x1920 loop (pipeline/synthetic.py), same detector, same frames:
  naive     MuseTalk-style: dlib HOG on every full-resolution frame, then landmarks,
            crops and masks (the same code as hotplate's stages);
  hotplate  `pipeline.precompile.run` into a fresh store;
  decode    decoding the video's frames and nothing else.
Then latents per second with an SD-VAE-sized AutoencoderKL (random weights, CPU).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from cachestore.store import open_store
from pipeline import synthetic
from pipeline.media import iter_frames
from pipeline.nets.detectors import load_detector
from pipeline.nets.landmarks import load_landmarker
from pipeline.precompile.crops import crop_resize, half_face_box
from pipeline.precompile.masks import blend_square, landmark_mask
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from pipeline.precompile.tracking import track_naive


def naive(video: Path) -> tuple[float, float]:
    """Per-frame full-resolution detection plus the same per-frame stages."""
    start = time.perf_counter()
    frames = list(iter_frames(video))
    result = track_naive(frames, load_detector("dlib", None))
    landmarker = load_landmarker("dlib", None)
    for frame, box in zip(frames, result.boxes, strict=True):
        lm = landmarker.predict(frame, box)
        crop_box = half_face_box(lm, 0, frame.shape, box)
        crop_resize(frame, crop_box)
        landmark_mask(lm, crop_box, blend_square(crop_box))
    return time.perf_counter() - start, result.detector_seconds


def latents_per_second(tmp: Path, n: int = 8) -> float:
    import torch
    from diffusers import AutoencoderKL

    from pipeline.nets.vae import encode_latents, load_vae

    torch.manual_seed(0)
    # the sd-vae-ft-mse architecture (diffusers' defaults for it), random weights
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(128, 256, 512, 512),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=2,
    )
    vae.save_pretrained(tmp / "models" / "sd-vae-ft-mse")
    loaded, _ = load_vae(tmp / "models", "sd-vae-ft-mse")
    crops = np.random.default_rng(0).integers(0, 255, (n, 256, 256, 3), dtype=np.uint8)
    encode_latents(loaded, crops[:2])  # warm-up
    start = time.perf_counter()
    encode_latents(loaded, crops)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--no-vae", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        video = synthetic.write_loop_video(tmp / "loop.mp4", n_frames=args.frames, motion="gentle")
        start = time.perf_counter()
        n = sum(1 for _ in iter_frames(video))
        decode_s = time.perf_counter() - start
        naive_s, naive_det = naive(video)
        start = time.perf_counter()
        report = precompile(video, Recipe(max_frames=0), open_store(tmp / "store"))
        hot_s = time.perf_counter() - start
        track = next(s for s in report.stages if s.name == "track")
        with open_store(tmp / "store").read() as r:
            det_s = r.get("stage", track.key)["meta"]["detector_seconds"]
        print(f"{n} frames 1080x1920, dlib HOG + dlib 68-point landmarks")
        print(f"decode only            {decode_s:7.2f} s")
        print(
            f"naive per-frame        {naive_s:7.2f} s  (detector {naive_det:.2f} s, {n} detections)"
        )
        print(
            f"hotplate precompile    {hot_s:7.2f} s  (detector {det_s:.2f} s, {report.counts['detections']} detections)"
        )
        for s in report.stages:
            print(f"  {s.name:10} {s.seconds:6.2f} s")
        print(f"detector-seconds ratio naive/hotplate: {naive_det / det_s:.1f}x (goal >= 20x)")
        print(f"end-to-end ratio naive/hotplate:       {naive_s / hot_s:.1f}x")
        print(f"precompile / decode-only:              {hot_s / decode_s:.1f}x (goal <= 4x)")
        if not args.no_vae:
            print(
                f"VAE latents on CPU (SD-VAE size, random weights): {latents_per_second(tmp):.1f} crops/s"
            )


if __name__ == "__main__":
    main()
