"""What does the hit path's integrity check cost? Run: python bench/bench_integrity.py

A 150-frame 1080x1920 avatar (JPEG frames as the decode stage stores them, boxes,
landmarks, 256x256 crops and masks, VAE latents) is written to a fresh store; then,
side by side in one run, warm page cache, best of 5 (nothing is asserted):

a) the full check `Store.damaged_stages(stages)`: every blob hashed whole (xxh3-128, its digest);
b) the light check `damaged_stages(stages, checksums=False)`: headers and sizes only;
b') the warm hit check `damaged_stages(stages, trust_unmoved=True)` (what `hot_check` runs)
   in a process that hashed these blobs once: headers, sizes and where LMDB keeps them;
c) baseline 1, the bytes a hot render reads: `load_assets` plus every frame blob copied
   out of the store (what the render's frame loader reads, without the JPEG decode);
d) baseline 2, the frame decode a render does anyway: every stored JPEG decoded once.

It records a) and b) against c), b') against a), and a) against c)+d). Options: --frames N and --size WxH.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from harness import Bench, best_of, run_bench

from cachestore.store import forget_store, open_store
from hotplate.demo_data import iter_loop_frames
from pipeline.frames import frame_name
from pipeline.hot import load_assets
from pipeline.media import decode_frame, encode_frame


def write_avatar(store, n: int, size: tuple[int, int]) -> tuple[str, dict[str, str], int]:
    """An avatar with the stages and array shapes precompile writes; returns its key,
    its stages and the bytes its blobs hold."""
    rng = np.random.default_rng(0)
    frames = {
        frame_name(i): np.frombuffer(encode_frame(f), np.uint8)
        for i, f in enumerate(iter_loop_frames(n, size))
    }
    stages = {
        "decode": (frames, {"frames": n, "fps": 25.0, "width": size[0], "height": size[1]}),
        "track": ({"boxes": rng.random((n, 4), np.float32) * 500}, {}),
        "landmarks": ({"landmarks": rng.random((n, 68, 2), np.float32) * 500}, {}),
        "crops": (
            {
                "crop_boxes": rng.integers(0, 500, (n, 4), np.int32),
                "crops": rng.integers(0, 256, (n, 256, 256, 3), np.uint8),
            },
            {},
        ),
        "masks": (
            {
                "mask_boxes": rng.integers(0, 500, (n, 4), np.int32),
                "masks": rng.integers(0, 256, (n, 256, 256), np.uint8),
            },
            {},
        ),
        "latents": ({"latents": rng.random((n, 8, 32, 32)).astype(np.float16)}, {}),
    }
    keys, nbytes = {}, 0
    for name, (arrays, meta) in stages.items():
        record = store.put_stage(f"bench-{name}", name, arrays, meta)
        keys[name], nbytes = record.key, nbytes + record.nbytes
    store.put_avatar(
        "bench-avatar",
        {
            "stages": keys,
            "source_digest": "",
            "source": "",
            "frames": n,
            "fps": 25.0,
            "width": size[0],
            "height": size[1],
            "counts": {},
        },
    )
    return "bench-avatar", keys, nbytes


def add_arguments(ap) -> None:
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--size", default="1080x1920", help="WxH of the frames")


def main(bench: Bench) -> None:
    args = bench.args
    size = tuple(int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "store")
        print(f"writing a {args.frames}-frame {args.size} avatar ...")
        key, stages, nbytes = write_avatar(store, args.frames, size)

        def frame_blobs() -> list[np.ndarray]:
            """The stored JPEG bytes of every frame, copied out as the render's loader does."""
            assets = load_assets(store, key)
            with store.read() as r:
                return [r.array(d).copy() for d in assets.load_frame.digests]

        def decode_every_frame() -> None:
            for blob in frame_blobs():
                decode_frame(blob)

        if store.damaged_stages(stages) != []:
            raise SystemExit("the avatar just written reads as damaged")
        full = best_of(lambda: store.damaged_stages(stages), 5)
        light = best_of(lambda: store.damaged_stages(stages, checksums=False), 5)
        store.damaged_stages(stages, trust_unmoved=True)  # this process hashes them once
        warm = best_of(lambda: store.damaged_stages(stages, trust_unmoved=True), 5)
        read = best_of(frame_blobs, 5)
        decode = best_of(decode_every_frame, 2) - read
        forget_store(Path(tmp) / "store")
    mb = nbytes / 2**20
    print(f"avatar blobs: {mb:.1f} MiB; best of 5, warm page cache")
    inputs = {"loop_frames": args.frames, "resolution": args.size, "avatar_mib": round(mb, 1)}
    reads = "the bytes a hot render reads (load_assets + every frame blob copied out)"
    bench.figure(
        "hit-path check, full (every blob hashed)",
        full * 1e3,
        "ms",
        baseline=reads,
        baseline_value=read * 1e3,
        better="lower",
        inputs=inputs,
        note=f"{mb / full:.0f} MiB/s",
    )
    bench.figure(
        "hit-path check, headers and sizes only",
        light * 1e3,
        "ms",
        baseline=reads,
        baseline_value=read * 1e3,
        better="lower",
        inputs=inputs,
    )
    bench.figure(
        "hit-path check, warm process (blobs hashed before and unmoved are not hashed again)",
        warm * 1e3,
        "ms",
        baseline="the full check (every blob hashed)",
        baseline_value=full * 1e3,
        better="lower",
        inputs=inputs,
    )
    bench.figure(
        "hit-path check, full (every blob hashed)",
        full * 1e3,
        "ms",
        baseline="those bytes read and every frame's JPEG decoded, as a render does anyway",
        baseline_value=(read + decode) * 1e3,
        better="lower",
        inputs=inputs,
    )


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"frames": 8, "size": "540x960"})
