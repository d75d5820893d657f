"""Keyframe tracking against per-frame detection. Run: python bench/bench_tracking.py

On synthetic 1080x1920 loops with known face boxes (hotplate/demo_data.py), compares
  naive     dlib HOG on every full-resolution frame,
  fixed     keyframes every 4th frame on the 480-px proxy, interpolated (no refinement),
  adaptive  the same plus refinement where neighbouring keyframes disagree (the recipe
            defaults: IoU < 0.6 or centre shift > 0.15 x box size),
  ad.7/.10  adaptive with the stricter refine_iou=0.7, refine_shift=0.10,
by detector seconds, detector calls, mean IoU to the truth (all frames, and the jump's
frames) and centre jitter (mean |second difference|, px/frame^2). Figures: detector time
and mean IoU of each tracker against naive, the jump's worst IoU against fixed. Asserts
nothing.
"""

from __future__ import annotations

import time

import numpy as np
from harness import Bench, run_bench

from hotplate import demo_data as synthetic
from pipeline.media import make_proxy
from pipeline.nets.detectors import load_detector
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.tracking import center_jitter, iou, track, track_naive


def row(name: str, result, truth: np.ndarray, jump: range) -> str:
    overlap = iou(result.boxes, truth)
    jump_iou = float(overlap[list(jump)].min()) if len(jump) else float("nan")
    return (
        f"{name:9} {result.detector_seconds:8.2f} {result.detections:6d} "
        f"{overlap.mean():9.3f} {overlap.min():8.3f} {jump_iou:9.3f} "
        f"{center_jitter(result.boxes):7.2f}"
    )


def compare(bench: Bench, motion: str, n_frames: int, detector) -> None:
    t0 = time.perf_counter()
    frames, truth = synthetic.make_loop_frames(n_frames, motion=motion)
    made = time.perf_counter() - t0
    jump = synthetic.jump_frames(n_frames) if motion == "jump" else range(0)

    recipe = Recipe()

    def proxy(i: int) -> tuple[np.ndarray, float]:
        return make_proxy(frames[i], 480)

    results = {
        "naive": track_naive(frames, detector),
        "fixed": track(n_frames, proxy, detector, refine_iou=0.0, refine_shift=float("inf")),
        "adaptive": track(
            n_frames,
            proxy,
            detector,
            refine_iou=recipe.refine_iou,
            refine_shift=recipe.refine_shift,
        ),
        # dlib's box jumps by a pyramid level (IoU 0.69) or a HOG cell (~0.1 box) between
        # neighbours with no real motion; these stricter thresholds refine on that noise.
        "ad.7/.10": track(n_frames, proxy, detector, refine_iou=0.7, refine_shift=0.10),
    }
    print(f"\n{motion}: {n_frames} frames 1080x1920 (made in {made:.1f} s), {detector.name}")
    print(
        f"{'tracker':9} {'det s':>8} {'calls':>6} {'mean IoU':>9} {'min IoU':>8} "
        f"{'jump IoU':>9} {'jitter':>7}"
    )
    for name, result in results.items():
        print(row(name, result, truth, jump))
    naive = results["naive"]
    inputs = {"loop_frames": n_frames, "resolution": "1080x1920", "motion": motion}
    inputs["detector"] = detector.name
    per_frame = f"naive: {detector.name} on every full-resolution frame"
    for name in ("fixed", "adaptive", "ad.7/.10"):
        result = results[name]
        bench.figure(
            f"{motion}: detector seconds, {name} keyframe tracking",
            result.detector_seconds,
            "s",
            baseline=per_frame,
            baseline_value=naive.detector_seconds,
            better="lower",
            inputs=inputs,
            note=f"{result.detections} calls vs {naive.detections}; {len(result.refined)} refined",
        )
        bench.figure(
            f"{motion}: mean IoU to the true boxes, {name}",
            float(iou(result.boxes, truth).mean()),
            "IoU",
            baseline=per_frame,
            baseline_value=float(iou(naive.boxes, truth).mean()),
            inputs=inputs,
        )
    if len(jump):
        worst = {k: float(iou(r.boxes, truth)[list(jump)].min()) for k, r in results.items()}
        bench.figure(
            "jump: worst IoU in the jump, adaptive",
            worst["adaptive"],
            "IoU",
            baseline="fixed stride, no refinement",
            baseline_value=worst["fixed"],
            inputs=inputs,
            note="goal > 0.6",
        )


def add_arguments(ap) -> None:
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--detector", default="dlib")


def main(bench: Bench) -> None:
    detector = load_detector(bench.args.detector, None)
    for motion in ("gentle", "jump"):
        compare(bench, motion, bench.args.frames, detector)


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"frames": 12})
