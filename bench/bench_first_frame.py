"""Time to the first encoded frame. Run: python bench/bench_first_frame.py

1. `hotplate render` as a whole process on a cold avatar (just-in-time precompile)
   and then on the hot one: the CLI's "first frame after" figure (from the command's
   entry, interpreter start excluded) and the whole process's wall time.
2. In one process, on the same loop: a hot render from the store against upstream
   MuseTalk's flow that first loads its avatar folder in upstream's real layout (the
   ping-pong cycle of full frames and masks as PNGs, coords.pkl, mask_coords.pkl,
   latents.pt via torch.load) and then renders with the same renderer.
`--video PATH` / `--audio PATH` use your clip and speech. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from cachestore.store import forget_store, open_store
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from pipeline.catalog import plan_for
from pipeline.hot import load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.render.video import render_video

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_store import write_upstream_folder  # noqa: E402


def cli_render(tmp: Path, out: str) -> tuple[float, float]:
    cmd = [
        sys.executable,
        "-m",
        "hotplate.cli",
        "--personas",
        str(tmp / "personas"),
        "--cache",
        str(tmp / "cache"),
        "render",
        "--persona",
        "astro",
        "--attire",
        "studio",
        "--audio",
        str(tmp / "a.wav"),
        "-o",
        str(tmp / out),
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    first = float(re.search(r"first frame after ([\d.]+) s", done.stdout).group(1))
    return first, wall


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--video", type=Path, help="a loop video (default: a generated one)")
    parser.add_argument("--audio", type=Path, help="a 16 kHz WAV (default: generated speech)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "personas" / "astro").mkdir(parents=True)
        video = tmp / "personas" / "astro" / "studio.mp4"
        if args.video:
            shutil.copy(args.video, video)
        else:
            write_loop_video(video, n_frames=args.frames)
        if args.audio:
            shutil.copy(args.audio, tmp / "a.wav")
        else:
            write_wav(tmp / "a.wav", make_speech_audio(args.seconds), 16000)
        cold_first, cold_wall = cli_render(tmp, "cold.mp4")
        hot_first, hot_wall = cli_render(tmp, "hot.mp4")
        print(
            f"1. hotplate render, {args.frames}-frame 1080x1920 loop, {args.seconds:.0f} s of audio"
        )
        print(
            f"   cold (JIT precompile)  first frame after {cold_first:6.2f} s   whole process {cold_wall:6.2f} s"
        )
        print(
            f"   hot  (store only)      first frame after {hot_first:6.2f} s   whole process {hot_wall:6.2f} s"
        )

        store = open_store(tmp / "cache")
        key = plan_for(store, video, Recipe()).avatar
        hot = load_assets(store, key)
        latents = np.random.default_rng(1).standard_normal((hot.n_frames, 8, 32, 32))
        write_upstream_folder(tmp / "avatar", hot, latents)
        runs = {"hotplate store": [], "upstream MuseTalk folder": []}
        for _ in range(3):
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
        print(
            "2. time to first frame in one process (load + first frame), best of 3, same renderer"
        )
        best = {k: min(v) for k, v in runs.items()}
        for k, v in best.items():
            print(f"   {k:22} {v * 1000:8.0f} ms")
        print(
            f"   ratio folder/store: {best['upstream MuseTalk folder'] / best['hotplate store']:.1f}x"
        )


if __name__ == "__main__":
    main()
