"""Time to the first encoded frame. Run: python bench/bench_first_frame.py

1. `hotplate render` as a whole process on a cold avatar (just-in-time precompile)
   and then on the hot one: the CLI's "first frame after" figure (from the command's
   entry, interpreter start excluded) and the whole process's wall time.
2. In one process, on the same loop: a hot render from the store against upstream
   MuseTalk's flow that first loads its avatar folder in upstream's real layout (the
   ping-pong cycle of full frames and masks as PNGs, coords.pkl, mask_coords.pkl,
   latents.pt via torch.load) and then renders with the same renderer.
`--video PATH` / `--audio PATH` use your clip and speech. Figures only; asserts nothing.
"""

from __future__ import annotations

import pickle
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from harness import Bench, run_bench

from bench.bench_store import write_upstream_folder
from cachestore.store import forget_store, open_store
from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from pipeline.catalog import plan_for
from pipeline.hot import load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.render.video import render_video


def cli_render(tmp: Path, out: str) -> tuple[float, float]:
    cmd = invocation(
        tmp / "personas",
        tmp / "cache",
        "render",
        "--persona",
        "astro",
        "--attire",
        "studio",
        "--audio",
        str(tmp / "a.wav"),
        "-o",
        str(tmp / out),
    )
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    found = re.search(r"first frame after ([\d.]+) s", done.stdout)
    if done.returncode or not found:
        raise SystemExit(
            f"hotplate render failed or said no first frame:\n{done.stdout}{done.stderr}"
        )
    return float(found.group(1)), wall


def load_upstream_folder(assets, folder: Path):
    """Upstream MuseTalk's realtime loader (bench_store.read_upstream_folder's reads) on
    its avatar folder, turned into the assets the same renderer takes: the ping-pong
    cycle of full frames and masks (read as 3-channel BGR, as upstream does), boxes."""
    import glob

    import cv2
    import torch

    def read_imgs(sub: str) -> list[np.ndarray]:
        paths = glob.glob(str(folder / sub / "*.[jpJP][pnPN]*[gG]"))
        paths = sorted(paths, key=lambda x: int(Path(x).stem))
        return [cv2.imread(p) for p in paths]

    latents = torch.load(folder / "latents.pt")
    with open(folder / "coords.pkl", "rb") as f:
        crop_boxes = np.array(pickle.load(f), np.int32)
    frames = [cv2.cvtColor(f, cv2.COLOR_BGR2RGB) for f in read_imgs("full_imgs")]
    with open(folder / "mask_coords.pkl", "rb") as f:
        mask_boxes = np.array(pickle.load(f), np.int32)
    masks = np.stack([m[..., 0] for m in read_imgs("mask")])
    n = assets.n_frames  # the first half of the ping-pong cycle is the loop itself
    return replace(
        assets,
        crop_boxes=crop_boxes[:n],
        mask_boxes=mask_boxes[:n],
        masks=masks[:n],
        latents=torch.cat(latents[:n]).numpy().astype(np.float16),
        load_frame=frames.__getitem__,
    )


def add_arguments(ap) -> None:
    ap.add_argument("--frames", type=int, default=50, help="frames of the generated loop")
    ap.add_argument("--size", default="1080x1920", help="WxH of the generated loop")
    ap.add_argument("--seconds", type=float, default=4.0, help="generated speech")
    ap.add_argument("--runs", type=int, default=3, help="in-process runs of 2. (best of)")
    ap.add_argument("--video", type=Path, help="a loop video (default: a generated one)")
    ap.add_argument("--audio", type=Path, help="a 16 kHz WAV (default: generated speech)")


def main(bench: Bench) -> None:
    args = bench.args
    size = tuple(int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "personas" / "astro").mkdir(parents=True)
        video = tmp / "personas" / "astro" / "studio.mp4"
        if args.video:
            shutil.copy(args.video, video)
        else:
            write_loop_video(video, n_frames=args.frames, size=size)
        if args.audio:
            shutil.copy(args.audio, tmp / "a.wav")
        else:
            write_wav(tmp / "a.wav", make_speech_audio(args.seconds), 16000)
        cold_first, cold_wall = cli_render(tmp, "cold.mp4")
        hot_first, hot_wall = cli_render(tmp, "hot.mp4")
        store = open_store(tmp / "cache")
        key = plan_for(store, video, Recipe()).avatar
        hot = load_assets(store, key)
        inputs = {
            "loop_frames": hot.n_frames,
            "resolution": f"{hot.width}x{hot.height}",
            "audio_seconds": args.seconds if not args.audio else "--audio",
            "renderer": "warp",
        }
        print(f"1. hotplate render, {hot.n_frames}-frame loop, {args.seconds:g} s of audio")
        bench.figure(
            "`hotplate render`, hot: first frame after the command's entry",
            hot_first,
            "s",
            baseline="the same command cold (JIT precompile)",
            baseline_value=cold_first,
            better="lower",
            inputs=inputs,
        )
        bench.figure(
            "`hotplate render`, hot: whole process",
            hot_wall,
            "s",
            baseline="the same command cold (JIT precompile)",
            baseline_value=cold_wall,
            better="lower",
            inputs=inputs,
        )

        latents = np.random.default_rng(1).standard_normal((hot.n_frames, 8, 32, 32))
        write_upstream_folder(tmp / "avatar", hot, latents)
        runs = {"hotplate store": [], "upstream MuseTalk folder": []}
        for _ in range(args.runs):
            start = time.perf_counter()
            assets = load_assets(store, key)
            report = render_video(assets, tmp / "a.wav", tmp / "s.mp4")
            runs["hotplate store"].append(
                time.perf_counter() - start - report.wall_seconds + report.first_frame_seconds
            )
            start = time.perf_counter()
            folder_assets = load_upstream_folder(assets, tmp / "avatar")
            report = render_video(folder_assets, tmp / "a.wav", tmp / "m.mp4")
            runs["upstream MuseTalk folder"].append(
                time.perf_counter() - start - report.wall_seconds + report.first_frame_seconds
            )
        forget_store(tmp / "cache")
        print(f"2. load + first frame in one process, best of {args.runs}, same renderer")
        best = {k: min(v) for k, v in runs.items()}
        bench.figure(
            "load + first frame in one process, from the store",
            best["hotplate store"] * 1e3,
            "ms",
            baseline="upstream MuseTalk's avatar folder (ping-pong PNGs, latents.pt, pickles) "
            "loaded as its realtime script does, same renderer",
            baseline_value=best["upstream MuseTalk folder"] * 1e3,
            better="lower",
            inputs=inputs,
        )


if __name__ == "__main__":
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={"frames": 4, "size": "540x960", "seconds": 1, "runs": 1},
    )
