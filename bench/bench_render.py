"""Warp render throughput at 1080x1920, as a multiple of real time.

    .venv/bin/python bench/bench_render.py [--seconds 8] [--frames 24]
        [--video PATH] [--audio PATH]

The avatar is precompiled into a real store (LMDB) from `--video` (default: a generated
1080x1920 loop of `--frames` frames) and loaded with `pipeline.hot.load_assets`, as a hot
render does: frames decode from the store's JPEG blobs. Prints, for that render and for
the same frames held decoded in a Python list (the upper bound, no store): the whole
render's speed as a multiple of real time (goal >= 1.0x), output frames per second, and
the time to the first frame handed to the encoder; then each stage on its own, so the
bottleneck is visible. `--audio` replaces the generated speech. Figures only, no asserts.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cachestore.store import open_store  # noqa: E402
from hotplate.demo_data import (
    write_loop_video,  # noqa: E402
    write_wav,  # noqa: E402
)
from pipeline.catalog import plan_for  # noqa: E402
from pipeline.hot import load_assets  # noqa: E402
from pipeline.precompile.recipe import Recipe  # noqa: E402
from pipeline.precompile.run import precompile  # noqa: E402
from pipeline.render.encode import DEFAULT_PRESET, Mp4Writer  # noqa: E402
from pipeline.render.renderers.warp import WarpRenderer  # noqa: E402
from pipeline.render.video import render_video  # noqa: E402
from tests.pipeline.render_fixtures import speech  # noqa: E402


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def per_second(n: int, fn) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="audio length")
    ap.add_argument("--frames", type=int, default=24, help="stored frames in the loop")
    ap.add_argument("--video", type=Path, help="video to precompile (default: a generated loop)")
    ap.add_argument("--audio", type=Path, help="speech to render (default: generated)")
    args = ap.parse_args()

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        video = args.video or write_loop_video(Path(tmp) / "loop.mp4", n_frames=args.frames)
        store = open_store(Path(tmp) / "cache")
        precompile(video, Recipe(), store)
        assets = load_assets(store, plan_for(store, video, Recipe()).avatar)
        frames_list = [assets.load_frame(i) for i in range(assets.n_frames)]
        in_memory = replace(assets, load_frame=frames_list.__getitem__)
        print(
            f"setup: {assets.n_frames} stored {assets.width}x{assets.height} frames precompiled "
            f"into a store in {time.perf_counter() - t0:.1f} s; cores: {cores}; "
            f"load average: {os.getloadavg()[0]:.1f}"
        )
        wav = args.audio or write_wav(Path(tmp) / "speech.wav", speech(args.seconds, 16000), 16000)
        print(f"\nrender_video, warp, {wav.name} at 25 fps:")
        for label, a in (
            ("frames from the store", assets),
            ("frames in a list", in_memory),
        ):
            cpu0 = cpu_seconds()
            rep = render_video(a, wav, Path(tmp) / "out.mp4")
            cpu_ms = (cpu_seconds() - cpu0) / rep.frames * 1000
            print(
                f"  {label:24s} {rep.realtime_factor:5.2f}x real time, {rep.render_fps:5.1f} fps, "
                f"first frame after {rep.first_frame_seconds * 1000:.0f} ms, wall {rep.wall_seconds:.1f} s"
            )
            # Wall time depends on what else runs on the machine; CPU time per frame does not.
            idle = cores * 1000 / cpu_ms / 25
            print(
                f"  {'':24s} CPU {cpu_ms:.1f} ms/frame: ~{idle:.2f}x real time on {cores} idle cores"
            )

        n = 100
        frames = [frames_list[i % assets.n_frames] for i in range(n)]
        r = WarpRenderer()
        r.prepare(assets, speech(n / 25, 48000), 48000, n, 25.0)
        r.render_batch(
            list(range(assets.n_frames)), list(range(assets.n_frames)), frames[: assets.n_frames]
        )
        print("\nstages alone, frames per second (one thread each):")
        print(
            f"  fetch: store + JPEG decode{per_second(n, lambda: [assets.load_frame(i % assets.n_frames) for i in range(n)]):6.1f}"
        )
        print(
            f"  render: warp + blend      {per_second(n, lambda: [r.render(t, t % assets.n_frames, frames[t]) for t in range(n)]):6.1f}"
        )

        def encode() -> None:
            with Mp4Writer(
                Path(tmp) / "enc.mp4",
                assets.width,
                assets.height,
                25,
                audio=np.zeros(n * 640, np.float32),
            ) as w:
                for f in frames:
                    w.write(f)

        print(f"  encode: H.264 {DEFAULT_PRESET:11s}{per_second(n, encode):6.1f}")


if __name__ == "__main__":
    main()
