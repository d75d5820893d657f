"""Warp render throughput at 1080x1920, as a multiple of real time.

    .venv/bin/python bench/bench_render.py [--seconds 20] [--frames 24]

Prints, for stored frames held in memory and for stored frames decoded from JPEG
blobs as the store keeps them (pipeline.media.encode_frame): the whole render's
speed as a multiple of real time (goal >= 1.0x), output frames per second, and the
time to the first frame handed to the encoder; then each stage on its own, so the
bottleneck is visible. Figures only, no asserts.
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

from pipeline.media import decode_frame, encode_frame  # noqa: E402
from pipeline.render.encode import DEFAULT_PRESET, Mp4Writer  # noqa: E402
from pipeline.render.renderers.warp import WarpRenderer  # noqa: E402
from pipeline.render.video import render_video  # noqa: E402
from pipeline.synthetic import write_wav  # noqa: E402
from tests.pipeline.render_fixtures import FULL, build_assets, speech  # noqa: E402


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def per_second(n: int, fn) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="audio length")
    ap.add_argument("--frames", type=int, default=24, help="stored frames in the loop")
    args = ap.parse_args()

    t0 = time.perf_counter()
    assets = build_assets(args.frames, FULL)
    blobs = [encode_frame(assets.load_frame(i)) for i in range(assets.n_frames)]
    jpeg_assets = replace(assets, load_frame=lambda i: decode_frame(blobs[i]))
    cores = os.cpu_count() or 1
    print(
        f"setup: {args.frames} stored 1080x1920 frames in {time.perf_counter() - t0:.1f} s; "
        f"cores: {cores}; load average: {os.getloadavg()[0]:.1f}"
    )

    with tempfile.TemporaryDirectory() as tmp:
        wav = write_wav(Path(tmp) / "speech.wav", speech(args.seconds, 16000), 16000)
        print(f"\nrender_video, warp, {args.seconds:.0f} s of audio at 25 fps:")
        for label, a in (("frames in memory", assets), ("frames from JPEG blobs", jpeg_assets)):
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
        frames = [assets.load_frame(i % assets.n_frames) for i in range(n)]
        r = WarpRenderer()
        r.prepare(assets, speech(n / 25, 48000), 48000, n, 25.0)
        r.render_batch(
            list(range(assets.n_frames)), list(range(assets.n_frames)), frames[: assets.n_frames]
        )
        print("\nstages alone, frames per second (one thread each):")
        print(
            f"  fetch: JPEG decode        {per_second(n, lambda: [decode_frame(blobs[i % len(blobs)]) for i in range(n)]):6.1f}"
        )
        print(
            f"  render: warp + blend      {per_second(n, lambda: [r.render(t, t % assets.n_frames, frames[t]) for t in range(n)]):6.1f}"
        )

        def encode() -> None:
            with Mp4Writer(
                Path(tmp) / "enc.mp4", FULL[0], FULL[1], 25, audio=np.zeros(n * 640, np.float32)
            ) as w:
                for f in frames:
                    w.write(f)

        print(f"  encode: H.264 {DEFAULT_PRESET:11s}{per_second(n, encode):6.1f}")


if __name__ == "__main__":
    main()
