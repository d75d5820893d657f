"""Which codec should the store use for full frames? Run: python bench/bench_frame_codec.py

Compares raw, PNG (compression 1), JPEG q95 4:4:4 and WebP lossless on `--frames`
synthetic 1080x1920 frames, on one OpenCV thread: bytes per frame, encode and decode ms,
PSNR. The synthetic frames are an upscaled photo, smoother than camera footage, so the
table is repeated with mild sensor noise (sigma 2) added, which is closer to decoded video.
A render decodes one stored frame per output frame: at 25 fps that must stay well under
40 ms on one core, leaving time for the blend and the encoder. Baselines: the raw frame
(its bytes, and a copy out of them for decode).
"""

from __future__ import annotations

import time

import cv2
import numpy as np
from harness import Bench, psnr, run_bench

from hotplate import demo_data as synthetic
from pipeline import media

CODECS = ("png-1", "jpeg-q95-444", "webp-lossless")


def measure(bench: Bench, frames: list[np.ndarray], noise: float) -> None:
    raw_bytes = frames[0].nbytes
    h, w = frames[0].shape[:2]
    inputs = {"frames": len(frames), "resolution": f"{w}x{h}", "noise_sigma": noise}
    print(f"{'codec':16} {'KiB/frame':>10} {'x raw':>7} {'enc ms':>8} {'dec ms':>8} {'PSNR dB':>8}")
    t0 = time.perf_counter()
    blobs = [f.tobytes() for f in frames]
    for b in blobs:
        np.frombuffer(b, np.uint8).reshape(frames[0].shape).copy()
    raw_dec = (time.perf_counter() - t0) / len(frames)
    print(
        f"{'raw':16} {raw_bytes / 1024:10.0f} {1.0:7.2f} {'-':>8} {raw_dec * 1e3:8.1f} {'inf':>8}"
    )
    for codec in CODECS:
        t0 = time.perf_counter()
        blobs = [media.encode_frame(f, codec) for f in frames]
        enc = (time.perf_counter() - t0) / len(frames)
        t0 = time.perf_counter()
        decoded = [media.decode_frame(b) for b in blobs]
        dec = (time.perf_counter() - t0) / len(frames)
        size = float(np.mean([len(b) for b in blobs]))
        quality = min(psnr(a, b) for a, b in zip(frames, decoded, strict=True))
        print(
            f"{codec:16} {size / 1024:10.0f} {size / raw_bytes:7.3f} {enc * 1e3:8.1f} "
            f"{dec * 1e3:8.1f} {quality:8.1f}"
        )
        tag = f"{codec}{', noisy' if noise else ''}"
        bench.figure(
            f"{tag}: size per frame",
            size / 1024,
            "KiB",
            baseline="raw RGB frame",
            baseline_value=raw_bytes / 1024,
            better="lower",
            inputs=inputs,
        )
        bench.figure(
            f"{tag}: encode", enc * 1e3, "ms/frame", better="lower", inputs=inputs, note="1 thread"
        )
        bench.figure(
            f"{tag}: decode",
            dec * 1e3,
            "ms/frame",
            baseline="copy out of the raw bytes",
            baseline_value=raw_dec * 1e3,
            better="lower",
            inputs=inputs,
            note="1 thread",
        )
        if np.isfinite(quality):  # lossless codecs: identical frames, nothing to state
            bench.figure(f"{tag}: PSNR, worst frame", quality, "dB", inputs=inputs)


def add_arguments(ap) -> None:
    ap.add_argument("--frames", type=int, default=30, help="synthetic 1080x1920 frames")


def main(bench: Bench) -> None:
    cv2.setNumThreads(1)  # one core, as a render worker gets
    frames, _ = synthetic.make_loop_frames(bench.args.frames, motion="gentle")
    print(f"{len(frames)} synthetic frames {frames[0].shape[1]}x{frames[0].shape[0]}, one thread")
    print(f"chosen: FRAME_CODEC = {media.FRAME_CODEC!r}\n")
    measure(bench, frames, 0.0)
    rng = np.random.default_rng(0)
    noisy = [
        np.clip(f.astype(np.int16) + rng.normal(0, 2, f.shape).astype(np.int16), 0, 255).astype(
            np.uint8
        )
        for f in frames
    ]
    print("\nwith sensor noise (sigma 2), closer to camera footage:")
    measure(bench, noisy, 2.0)


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"frames": 2})
