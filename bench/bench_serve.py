"""`hotplate serve` against an in-process render. Run: python bench/bench_serve.py

For one hot avatar (a 540x960 loop, 16 frames) and a 4 s speech clip:
1. overhead: median latency of POST /v1/lip-sync at concurrency 1 (upload, checks,
   queue, worker, MP4 back over loopback) over the median of `lip_sync()` called in
   this process (the baseline: the same entry point, no HTTP, no worker hop), as a ratio;
2. throughput: requests/s and p50/p95 latency at concurrency 1, 2 and 4 with --workers
   render workers (default 2: this machine has 2 cores), and the count of failed requests
   (goal: zero).

Requests go only to 127.0.0.1 and are bounded (--requests per concurrency level).
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hotplate import demo_data as synthetic  # noqa: E402
from tests.hotplate.serve_helpers import Server, post_render  # noqa: E402

SIZE = (540, 960)
FRAMES = 16
CLIP_SECONDS = 4.0


def make_hot_avatar(root: Path) -> Path:
    """personas/astro/studio.mp4, precompiled into root/cache; returns the clip."""
    from cachestore.store import forget_store, open_store
    from pipeline.precompile.recipe import Recipe
    from pipeline.precompile.run import precompile

    loop = root / "personas" / "astro" / "studio.mp4"
    loop.parent.mkdir(parents=True)
    synthetic.write_loop_video(loop, n_frames=FRAMES, size=SIZE)
    precompile(loop, Recipe(), open_store(root / "cache"))
    forget_store(root / "cache")
    return synthetic.write_wav(root / "clip.wav", synthetic.make_speech_audio(CLIP_SECONDS), 16000)


def in_process(root: Path, clip: Path, repeats: int) -> list[float]:
    """Seconds per lip_sync() call in this process, after one warm-up call."""
    from cachestore.store import forget_store, open_store
    from pipeline.lip_sync import LipSyncRequest, lip_sync
    from pipeline.precompile.recipe import Recipe

    store = open_store(root / "cache")
    request = LipSyncRequest("astro", "studio", clip, root / "in-process.mp4")
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        outcome = lip_sync(store, root / "personas", Recipe(), request)
        if i:
            times.append(time.perf_counter() - start)
        assert not outcome.jit, "the avatar should be hot"
    forget_store(root / "cache")
    return times


def load(server: Server, clip: Path, concurrency: int, requests: int) -> dict:
    """`requests` POST /v1/lip-sync spread over `concurrency` threads."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    todo = list(range(requests))

    def client_loop() -> None:
        with server.client() as c:
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                start = time.perf_counter()
                answer = post_render(c, "/v1/lip-sync", clip)
                took = time.perf_counter() - start
                with lock:
                    if answer.status_code == 200 and answer.headers["x-hotplate-cache"] == "hit":
                        latencies.append(took)
                    else:
                        failures.append(f"{answer.status_code} {answer.text[:120]}")

    start = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return {
        "rps": len(latencies) / wall,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p95": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        if latencies
        else float("nan"),
        "failed": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8, help="per concurrency level")
    parser.add_argument("--repeats", type=int, default=4, help="in-process baseline calls")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        root = Path(tmp)
        clip = make_hot_avatar(root)
        baseline = statistics.median(in_process(root, clip, args.repeats))
        with Server(root, "--workers", str(args.workers), "--queue-size", "64") as server:
            with server.client() as c:  # warm every worker (first render loads its imports)
                for _ in range(args.workers):
                    post_render(c, "/v1/lip-sync", clip)
            results = {n: load(server, clip, n, args.requests) for n in (1, 2, 4)}
    print(
        f"hot avatar {SIZE[0]}x{SIZE[1]} ({FRAMES}-frame loop), {CLIP_SECONDS:g} s clip, "
        f"{args.workers} workers, {os.cpu_count()} CPUs"
    )
    print(f"in-process lip_sync() median   {baseline:.3f} s   (baseline)")
    overhead = results[1]["p50"] / baseline
    print(f"POST /v1/lip-sync median (c=1) {results[1]['p50']:.3f} s   = {overhead:.2f}x baseline")
    print(f"{'concurrency':>11} {'req/s':>7} {'p50 s':>7} {'p95 s':>7} {'failed':>7}")
    for n, r in results.items():
        print(f"{n:>11} {r['rps']:>7.2f} {r['p50']:>7.3f} {r['p95']:>7.3f} {len(r['failed']):>7}")
    for n, r in results.items():
        for failure in r["failed"][:3]:
            print(f"failed at concurrency {n}: {failure}")


if __name__ == "__main__":
    main()
