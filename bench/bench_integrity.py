"""What does the hit path's integrity check cost? Run: python bench/bench_integrity.py

A 150-frame 1080x1920 avatar (JPEG frames as the decode stage stores them, boxes,
landmarks, 256x256 crops and masks, VAE latents) is written to a fresh store; then,
side by side in one run, warm page cache, best of 5 (nothing is asserted):

a) the full check `Store.damaged_stages(stages)`: every blob hashed whole (xxh3-128, its digest);
b) the light check `damaged_stages(stages, checksums=False)`: headers and sizes only;
c) baseline 1, the bytes a hot render reads: `load_assets` plus every frame blob copied
   out of the store (what the render's frame loader reads, without the JPEG decode);
d) baseline 2, the frame decode a render does anyway: every stored JPEG decoded once.

It prints each in ms and a) as a fraction of c) and of c)+d). Options: --frames N and
--size WxH for a quick run (e.g. --frames 30 --size 540x960).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_store import best  # noqa: E402
from cachestore.store import forget_store, open_store  # noqa: E402
from hotplate.demo_data import iter_loop_frames  # noqa: E402
from pipeline.frames import frame_name  # noqa: E402
from pipeline.hot import load_assets  # noqa: E402
from pipeline.media import decode_frame, encode_frame  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--size", default="1080x1920", help="WxH of the frames")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "store")
        print(f"writing a {args.frames}-frame {args.size} avatar ...")
        key, stages, nbytes = write_avatar(store, args.frames, size)

        def read_like_a_render() -> None:
            assets = load_assets(store, key)
            for i in range(args.frames):
                assets.load_frame._blob(i)

        def decode_every_frame() -> None:
            assets = load_assets(store, key)
            for i in range(args.frames):
                decode_frame(assets.load_frame._blob(i))

        assert store.damaged_stages(stages) == []
        full = best(lambda: store.damaged_stages(stages), 5)
        light = best(lambda: store.damaged_stages(stages, checksums=False), 5)
        read = best(read_like_a_render, 5)
        decode = best(decode_every_frame, runs=2) - read
        forget_store(Path(tmp) / "store")
    mb = nbytes / 2**20
    print(f"avatar blobs: {mb:.1f} MiB; best of 5, warm page cache (machine shared while measured)")
    print(f"a) full check (xxh3-128 of each blob) {full * 1000:8.1f} ms  ({mb / full:.0f} MiB/s)")
    print(f"b) headers and sizes only               {light * 1000:8.1f} ms")
    print(f"c) bytes a hot render reads (baseline)  {read * 1000:8.1f} ms")
    print(f"d) JPEG decode of every frame           {decode * 1000:8.1f} ms")
    print(f"a / c = {full / read:.2f}   a / (c + d) = {full / (read + decode):.3f}")


if __name__ == "__main__":
    main()
