"""Time to the first encoded frame. Run: python bench/bench_first_frame.py

1. `hotplate render` as a whole process on a cold avatar (just-in-time precompile)
   and then on the hot one: the CLI's "first frame after" figure (from the command's
   entry, interpreter start excluded) and the whole process's wall time.
2. In one process, on the same 1080x1920 loop: a hot render from the store against a
   MuseTalk-style flow that first loads the avatar folder (one PNG per full frame,
   one PNG per mask, pickled boxes and landmarks) and then renders with the same
   renderer. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import pickle
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from cachestore.store import forget_store, open_store
from pipeline.catalog import plan_for
from pipeline.hot import load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.render.video import render_video
from pipeline.synthetic import make_speech_audio, write_loop_video, write_wav


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


def musetalk_style_folder(assets, folder: Path) -> None:
    import cv2

    (folder / "full_imgs").mkdir(parents=True)
    (folder / "mask").mkdir()
    for i in range(assets.n_frames):
        cv2.imwrite(
            str(folder / "full_imgs" / f"{i:08d}.png"),
            cv2.cvtColor(assets.load_frame(i), cv2.COLOR_RGB2BGR),
        )
        cv2.imwrite(str(folder / "mask" / f"{i:08d}.png"), assets.masks[i])
    with open(folder / "coords.pkl", "wb") as f:
        pickle.dump([tuple(b) for b in assets.crop_boxes], f)
    with open(folder / "mask_coords.pkl", "wb") as f:
        pickle.dump([tuple(b) for b in assets.mask_boxes], f)
    with open(folder / "landmarks.pkl", "wb") as f:
        pickle.dump(assets.landmarks, f)


def load_musetalk_style(assets, folder: Path):
    """What MuseTalk's avatar loader does before the first frame: read every image."""
    import cv2

    frames = [
        cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB)
        for p in sorted((folder / "full_imgs").glob("*.png"))
    ]
    masks = np.stack(
        [cv2.imread(str(p), cv2.IMREAD_GRAYSCALE) for p in sorted((folder / "mask").glob("*.png"))]
    )
    with open(folder / "coords.pkl", "rb") as f:
        crop_boxes = np.array(pickle.load(f), np.int32)
    with open(folder / "mask_coords.pkl", "rb") as f:
        mask_boxes = np.array(pickle.load(f), np.int32)
    with open(folder / "landmarks.pkl", "rb") as f:
        landmarks = pickle.load(f)
    return replace(
        assets,
        crop_boxes=crop_boxes,
        mask_boxes=mask_boxes,
        masks=masks,
        landmarks=landmarks,
        load_frame=frames.__getitem__,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "personas" / "astro").mkdir(parents=True)
        video = write_loop_video(tmp / "personas" / "astro" / "studio.mp4", n_frames=args.frames)
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
        musetalk_style_folder(load_assets(store, key), tmp / "avatar")
        runs = {"hotplate store": [], "MuseTalk-style folder": []}
        for _ in range(3):
            start = time.perf_counter()
            assets = load_assets(store, key)
            report = render_video(assets, tmp / "a.wav", tmp / "s.mp4")
            runs["hotplate store"].append(
                time.perf_counter() - start - report.wall_seconds + report.first_frame_seconds
            )
            start = time.perf_counter()
            folder_assets = load_musetalk_style(assets, tmp / "avatar")
            report = render_video(folder_assets, tmp / "a.wav", tmp / "m.mp4")
            runs["MuseTalk-style folder"].append(
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
            f"   ratio folder/store: {best['MuseTalk-style folder'] / best['hotplate store']:.1f}x"
        )


if __name__ == "__main__":
    main()
