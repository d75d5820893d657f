"""What stilling a talking loop costs. Run: python bench/bench_still.py [--quick] [--json FILE]

A talking loop of `--frames` frames at 1080x1920: Grace Hopper's portrait made to talk by
the warp renderer (`testkit/mouth_fixtures.py::talking_clip`, espeak-ng), upscaled and
padded, sound stripped. It is precompiled with the still stage and without it
(`Recipe(still="off")`) in one store; the figures are the still stage's own time per
frame (baseline: the rest of that precompile, decode to masks, per frame), the patch's
bytes (baseline: the stored frame's), and a stored frame's decode to I420 (`yuv(i)`, what
the hot path reads), stilled against as shot, the fastest of 7 interleaved passes per
frame, side by side in one run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from harness import Bench, run_bench

from cachestore.store import forget_store, open_store
from hotplate.demo_data import write_loop_video
from pipeline.hot import load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from testkit import faces
from testkit.mouth_fixtures import espeak, talking_clip, video_frames

WORDS = (
    "Hello everyone, welcome to the show. Today we talk about the weather and the markets, "
    "and what they mean for you."
)


def add_arguments(ap) -> None:
    ap.add_argument("--frames", type=int, default=120, help="loop length (frames)")


def loop_video(root: Path, frames: int) -> Path:
    import cv2

    face = faces.samples(("grace_hopper",), ("upright",))[0].image
    clip = talking_clip(face, espeak(WORDS, root / "own.wav"), root / "clip.mp4")
    out = []
    for f in video_frames(clip)[:frames]:
        g = cv2.resize(f, (1080, 1080), interpolation=cv2.INTER_CUBIC)
        canvas = np.empty((1920, 1080, 3), np.uint8)
        canvas[:] = g[0, 0]
        canvas[420:1500] = g
        out.append(canvas)
    return write_loop_video(root / "loop.mp4", out, fps=25.0)


def main(bench: Bench) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        video = loop_video(root, bench.args.frames)
        store = open_store(root / "store")
        try:
            report = precompile(video, Recipe(), store)
            stilled = load_assets(store, report.avatar)
            as_shot = load_assets(store, precompile(video, Recipe(still="off"), store).avatar)
            n = stilled.n_frames
            seconds = {s.name: s.seconds for s in report.stages}
            record = store.get_stage(store.get_avatar(stilled.key)["stages"]["still"])
            frames = store.get_stage(store.get_avatar(stilled.key)["stages"]["decode"])
            changed = int(record.meta["stilled"])
            inputs = {"loop_frames": n, "resolution": "1080x1920", "stilled_frames": changed}
            rest = sum(v for k, v in seconds.items() if k != "still")
            bench.figure(
                "still stage per frame",
                1000 * seconds["still"] / n,
                "ms",
                baseline="decode..masks of the same precompile, per frame",
                baseline_value=1000 * rest / n,
                better="lower",
                inputs=inputs,
            )
            bench.figure(
                "stilled patch per stilled frame",
                record.nbytes / max(changed, 1) / 1024,
                "KiB",
                baseline="a stored frame",
                baseline_value=frames.nbytes / n / 1024,
                better="lower",
                inputs=inputs,
            )
            best_as_shot, best_stilled = np.full(n, np.inf), np.full(n, np.inf)
            for _ in range(7):
                for i in range(n):
                    t = time.perf_counter()
                    as_shot.load_frame.yuv(i)
                    best_as_shot[i] = min(best_as_shot[i], time.perf_counter() - t)
                    t = time.perf_counter()
                    stilled.load_frame.yuv(i)
                    best_stilled[i] = min(best_stilled[i], time.perf_counter() - t)
            bench.figure(
                "stored frame decode to I420, stilled loop",
                1000 * float(best_stilled.mean()),
                "ms",
                baseline="the same loop as shot (still=off)",
                baseline_value=1000 * float(best_as_shot.mean()),
                better="lower",
                inputs=inputs,
            )
        finally:
            forget_store(root / "store")


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"frames": 24})
