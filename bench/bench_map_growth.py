"""What the transaction gate costs hot reads. Run: python bench/bench_map_growth.py

8 threads read a hot avatar's stored frames (one read transaction per frame, the bytes
copied out, as `pipeline/frames.py` does) for a fixed time, and the reads per second are
compared side by side, in alternating rounds, median of the rounds:

  gated     `Store.read()`: every transaction passes the readers-writer gate (today)
  ungated   `Store.read()` as it was before the gate (its code, copied here: begin,
            a Reader, abort), the baseline: the same reads, no gate
  growing   `Store.read()` while a writer thread keeps growing the map (it starts at the
            size the frames need and doubles many times); ungated reads cannot be measured
            this way: they crash (signal 11), which is what the gate is for.

Two kinds of read: `raw` (the transaction and the copy alone: the gate's worst case) and
`frames` (the copy and the JPEG decode of real 1080x1920 frames: what a render reads).
Goal: gated costs under 5% of ungated. Nothing is asserted.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import numpy as np
from harness import Bench, run_bench

from cachestore.store import Reader, Store


@contextmanager
def ungated_read(store: Store) -> Iterator[Reader]:
    """`Store.read` before the gate (commit 3d0c64b), for the baseline."""
    while True:
        try:
            txn = store.env.begin(buffers=True)
            break
        except lmdb.MapResizedError:
            store.env.set_mapsize(0)
    try:
        yield Reader(store, txn)
    finally:
        txn.abort()


def reads_per_second(
    store: Store, digests: list[str], threads: int, seconds: float, gated: bool, decode: bool
):
    from pipeline.media import decode_frame

    stop, counts = threading.Event(), [0] * threads
    db = store.dbs["blob"]

    def reader(n: int) -> None:
        i = n
        while not stop.is_set():
            key = digests[i % len(digests)].encode()
            with store.read() if gated else ungated_read(store) as r:
                data = bytes(r.txn.get(key, db=db))
            if decode:
                from cachestore.codec import decode as unpack_blob

                decode_frame(unpack_blob(data)[1])
            counts[n] += 1
            i += threads

    pool = [threading.Thread(target=reader, args=(n,)) for n in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    time.sleep(seconds)  # the measuring window (a bench, not a test)
    stop.set()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def grower(store: Store, stop: threading.Event, grown: list[int]) -> None:
    rng = np.random.default_rng(0)
    i = 0
    while not stop.is_set():
        before = store.env.info()["map_size"]
        store.put_stage(f"grow-{i}", "x", {"a": rng.integers(0, 255, 4 << 20, np.uint8)}, {})
        if store.env.info()["map_size"] > before:
            grown[0] += 1
        i += 1


def add_arguments(ap) -> None:
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.5, help="per measuring window")
    ap.add_argument("--rounds", type=int, default=5)


def main(bench: Bench) -> None:
    args = bench.args
    with tempfile.TemporaryDirectory() as tmp:
        from hotplate.demo_data import iter_loop_frames
        from pipeline.media import encode_frame

        frame = next(iter(iter_loop_frames(1, size=(1080, 1920))))
        jpeg = np.frombuffer(encode_frame(frame), np.uint8)
        store = Store(Path(tmp) / "cache", map_size=(args.frames + 8) * (jpeg.nbytes + 4096))
        frames = {
            f"frame/{i:06d}": np.append(jpeg, np.uint8(i % 251)).astype(np.uint8)
            for i in range(args.frames)
        }
        digests = list(store.put_stage("decode", "decode", frames, {}).blobs.values())
        print(
            f"{args.threads} threads reading {args.frames} stored 1080x1920 frames "
            f"({jpeg.nbytes >> 10} KiB JPEG each), median of {args.rounds} rounds of {args.seconds} s"
        )
        grows = [0]
        for decode in (False, True):
            gated, ungated, growing = [], [], []
            for _ in range(args.rounds):
                run = (store, digests, args.threads, args.seconds)
                gated.append(reads_per_second(*run, True, decode))
                ungated.append(reads_per_second(*run, False, decode))
                stop = threading.Event()
                writer = threading.Thread(target=grower, args=(store, stop, grows))
                writer.start()
                growing.append(reads_per_second(*run, True, decode))
                stop.set()
                writer.join()
            g, u, w = (statistics.median(x) for x in (gated, ungated, growing))
            kind = "frames (copy + JPEG decode)" if decode else "raw (transaction + copy)"
            inputs = {
                "threads": args.threads,
                "stored_frames": args.frames,
                "resolution": "1080x1920",
                "rounds": args.rounds,
                "window_seconds": args.seconds,
            }
            base = "Store.read as it was before the gate (ungated)"
            bench.figure(
                f"{kind}: gated Store.read",
                g,
                "reads/s",
                baseline=base,
                baseline_value=u,
                inputs=inputs,
                note=f"gate cost {100 * (1 - g / u):+.1f}%, goal < 5%",
            )
            bench.figure(
                f"{kind}: gated, beside a writer growing the map",
                w,
                "reads/s",
                baseline=f"{base}, no writer (ungated reads crash beside one)",
                baseline_value=u,
                inputs=inputs,
            )
        print(f"{grows[0]} map growths beside the readers; ungated reads would crash there")


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"frames": 8, "seconds": 0.3, "rounds": 1})
