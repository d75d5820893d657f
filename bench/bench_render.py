"""Warp render throughput at 1080x1920, as a multiple of real time.

    .venv/bin/python bench/bench_render.py [--seconds 8] [--frames 250]
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

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from harness import Bench, cpu_seconds, run_bench

from cachestore.store import open_store
from hotplate.demo_data import make_speech_audio as speech
from hotplate.demo_data import write_loop_video, write_wav
from pipeline.catalog import plan_for
from pipeline.hot import load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from pipeline.render.encode import DEFAULT_PRESET, Mp4Writer
from pipeline.render.renderers.warp import WarpRenderer
from pipeline.render.video import render_video


def per_second(n: int, fn) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def add_arguments(ap) -> None:
    ap.add_argument("--seconds", type=float, default=8.0, help="audio length")
    ap.add_argument(
        "--frames", type=int, default=250, help="stored frames in the loop (a short one flatters)"
    )
    ap.add_argument("--stage-frames", type=int, default=100, help="frames for each stage alone")
    ap.add_argument("--video", type=Path, help="video to precompile (default: a generated loop)")
    ap.add_argument("--audio", type=Path, help="speech to render (default: generated)")


def main(bench: Bench) -> None:
    args = bench.args
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
        reports = {}
        for label, a in (
            ("frames from the store", assets),
            ("frames in a list", in_memory),
        ):
            cpu0 = cpu_seconds()
            rep = render_video(a, wav, Path(tmp) / "out.mp4")
            cpu_ms = (cpu_seconds() - cpu0) / rep.frames * 1000
            reports[label] = rep, cpu_ms
            print(
                f"  {label:24s} {rep.realtime_factor:5.2f}x real time, {rep.render_fps:5.1f} fps, "
                f"first frame after {rep.first_frame_seconds * 1000:.0f} ms, wall {rep.wall_seconds:.1f} s"
            )
            # Wall time depends on what else runs on the machine; CPU time per frame does not.
            idle = cores * 1000 / cpu_ms / 25
            print(
                f"  {'':24s} CPU {cpu_ms:.1f} ms/frame: ~{idle:.2f}x real time on {cores} idle cores"
            )
        (store_rep, store_cpu), (list_rep, list_cpu) = reports.values()
        inputs = {
            "loop_frames": assets.n_frames,
            "resolution": f"{assets.width}x{assets.height}",
            "audio_seconds": round(store_rep.frames / 25, 2),
            "renderer": "warp",
        }
        in_list = "the same frames held decoded in a Python list (no store)"
        bench.figure(
            "warm render, frames read through the store (LMDB, JPEG)",
            store_rep.realtime_factor,
            "x real time",
            baseline=in_list,
            baseline_value=list_rep.realtime_factor,
            inputs=inputs,
            note="goal >= 1.0x",
        )
        bench.figure(
            "warm render through the store, CPU per frame",
            store_cpu,
            "ms",
            baseline=in_list,
            baseline_value=list_cpu,
            better="lower",
            inputs=inputs,
            note=f"~{cores * 1000 / store_cpu / 25:.2f}x real time on {cores} idle cores",
        )
        bench.figure(
            "warm render through the store, first frame",
            store_rep.first_frame_seconds * 1e3,
            "ms",
            baseline=in_list,
            baseline_value=list_rep.first_frame_seconds * 1e3,
            better="lower",
            inputs=inputs,
        )

        n = args.stage_frames
        frames = [frames_list[i % assets.n_frames] for i in range(n)]
        r = WarpRenderer()
        r.prepare(assets, speech(n / 25, 48000), 48000, n, 25.0)
        k = min(n, assets.n_frames)  # warm-up: the plans of the stored frames timed below
        r.render_batch(list(range(k)), list(range(k)), frames[:k])
        print("\nstages alone, frames per second:")
        stage = {**inputs, "frames": n}
        stage.pop("audio_seconds")
        fetch = per_second(n, lambda: [assets.load_frame(i % assets.n_frames) for i in range(n)])
        rt = {"baseline": "real time (25 frames/s)", "baseline_value": 25.0, "inputs": stage}
        bench.figure("stage alone: fetch (store + JPEG decode)", fetch, "frames/s", **rt)
        warp = per_second(
            n, lambda: [r.render(t, t % assets.n_frames, frames[t]) for t in range(n)]
        )
        bench.figure("stage alone: render (warp + blend)", warp, "frames/s", **rt)

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

        bench.figure(
            f"stage alone: encode (H.264 {DEFAULT_PRESET})",
            per_second(n, encode),
            "frames/s",
            **rt,
        )


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"seconds": 1.0, "frames": 6, "stage_frames": 4})
