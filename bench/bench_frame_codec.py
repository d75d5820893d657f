"""Which codec should the store use for full frames? Run: python bench/bench_frame_codec.py

Compares raw, PNG (compression 1), JPEG q95 4:4:4 and WebP lossless on 30 synthetic
1080x1920 frames, on one OpenCV thread: bytes per frame, encode and decode ms, PSNR.
The synthetic frames are an upscaled photo, smoother than camera footage, so the table
is repeated with mild sensor noise (sigma 2) added, which is closer to decoded video.
A render decodes one stored frame per output frame: at 25 fps that must stay well under
40 ms on one core, leaving time for the blend and the encoder.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hotplate import demo_data as synthetic  # noqa: E402
from pipeline import media  # noqa: E402

N_FRAMES = 30


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def bench(frames: list[np.ndarray]) -> None:
    raw_bytes = frames[0].nbytes
    print(f"{'codec':16} {'KiB/frame':>10} {'x raw':>7} {'enc ms':>8} {'dec ms':>8} {'PSNR dB':>8}")
    t0 = time.perf_counter()
    blobs = [f.tobytes() for f in frames]
    enc = (time.perf_counter() - t0) / len(frames)
    t0 = time.perf_counter()
    for b in blobs:
        np.frombuffer(b, np.uint8).reshape(frames[0].shape).copy()
    dec = (time.perf_counter() - t0) / len(frames)
    print(
        f"{'raw':16} {raw_bytes / 1024:10.0f} {1.0:7.2f} {enc * 1e3:8.1f} {dec * 1e3:8.1f} {'inf':>8}"
    )
    for codec in ("png-1", "jpeg-q95-444", "webp-lossless"):
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


def main() -> None:
    cv2.setNumThreads(1)  # one core, as a render worker gets
    frames, _ = synthetic.make_loop_frames(N_FRAMES, motion="gentle")
    print(f"{N_FRAMES} synthetic frames {frames[0].shape[1]}x{frames[0].shape[0]}, one thread")
    print(f"chosen: FRAME_CODEC = {media.FRAME_CODEC!r}\n")
    bench(frames)
    rng = np.random.default_rng(0)
    noisy = [
        np.clip(f.astype(np.int16) + rng.normal(0, 2, f.shape).astype(np.int16), 0, 255).astype(
            np.uint8
        )
        for f in frames
    ]
    print("\nwith sensor noise (sigma 2), closer to camera footage:")
    bench(noisy)


if __name__ == "__main__":
    main()
