"""`hotplate serve` against an in-process render. Run: python bench/bench_serve.py

For one hot avatar (a 540x960 loop, 16 frames) and a 4 s speech clip:
1. overhead: median latency of POST /v1/lip-sync at concurrency 1 (upload, checks,
   queue, worker, MP4 back over loopback) over the median of `lip_sync()` called in
   this process (the baseline: the same entry point, no HTTP, no worker hop), as a ratio;
2. throughput: requests/s and p50/p95 latency at concurrency 1, 2 and 4 with --workers
   render workers (default 2: this machine has 2 cores), and the count of failed requests
   (goal: zero);
3. the guard's cost (hotplate/serve/guard.py): p50/p95 of POST /v1/lip-sync on a server
   with the guard and on the same app with it removed (the baseline), one worker each,
   requests alternating between them so both share the machine's load; and the guard's
   own time per request, measured in this process around an app that reads the same
   multipart body, as a share of the request's p50;
4. the audio check on a bomb (an hour of silence in a FLAC of a few hundred kB), in this
   process: uploads.check_audio (header, then frame by frame up to the limit) against
   decoding the clip whole with load_audio (the check before issue #17, the baseline):
   seconds and peak traced memory of each.

Requests go only to 127.0.0.1 and are bounded (--requests per concurrency level).
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
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


def percentiles(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]


def serve_child(root: Path, port: int, guarded: bool) -> None:
    """`--serve-child`: the app create_app makes, with or without its guard, on uvicorn."""
    import uvicorn

    from hotplate.serve.app import ServeConfig, create_app
    from hotplate.serve.guard import Guard
    from hotplate.settings import load_settings

    settings = load_settings(personas=root / "personas", cache=root / "cache")
    app = create_app(ServeConfig(settings=settings, workers=1, data_dir=root / f"data-{port}"))
    if not guarded:  # the baseline: the same app, the guard taken out of its stack
        app.user_middleware = [m for m in app.user_middleware if m.cls is not Guard]
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class ChildServer(Server):
    """A Server (same readiness wait and stop) running serve_child instead of the CLI."""

    def __init__(self, root: Path, guarded: bool) -> None:
        super().__init__(root)
        self.guarded = guarded

    def start(self) -> ChildServer:
        self.log = open(self.root / f"serve-{self.port}.log", "wb")
        cmd = [sys.executable, __file__, "--serve-child", str(self.root), str(self.port)]
        cmd += [] if self.guarded else ["--no-guard"]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 180
        import httpx

        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None, self.log_text()
            time.sleep(0.2)
        raise AssertionError(self.log_text())


def guard_cost_in_process(clip: Path, repeats: int) -> tuple[float, float]:
    """Seconds per request of (guard around an app that reads the body, that app alone),
    fed the render form in 64 KiB messages as uvicorn does; medians of `repeats`."""
    from hotplate.serve.guard import Guard, Policy

    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="persona"\r\n\r\nastro\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="audio"; filename="c.wav"\r\n\r\n'
        ).encode()
        + clip.read_bytes()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    headers = [
        (b"host", b"127.0.0.1:8700"),
        (b"content-type", f"multipart/form-data; boundary={boundary}".encode()),
        (b"content-length", str(len(body)).encode()),
        (b"authorization", b"Bearer bench-token"),
    ]
    scope = {"type": "http", "method": "POST", "path": "/v1/lip-sync", "headers": headers}

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guarded = Guard(app, Policy.of(["bench-token"], [], body_limit=50_000_000))

    async def one(target) -> float:
        messages = iter(chunks)

        async def receive():
            chunk = next(messages, b"")
            return {"type": "http.request", "body": chunk, "more_body": chunk is not chunks[-1]}

        async def send(message):
            pass

        start = time.perf_counter()
        await target(dict(scope), receive, send)
        return time.perf_counter() - start

    async def run() -> tuple[float, float]:
        with_guard, alone = [], []
        for _ in range(repeats):  # alternate, so both see the same conditions
            with_guard.append(await one(guarded))
            alone.append(await one(app))
        return statistics.median(with_guard), statistics.median(alone)

    return asyncio.run(run())


def guard_cost(root: Path, clip: Path, requests: int) -> None:
    with ChildServer(root, guarded=True) as on, ChildServer(root, guarded=False) as off:
        times: dict[bool, list[float]] = {True: [], False: []}
        with on.client() as c_on, off.client() as c_off:
            for c in (c_on, c_off):  # warm each worker (first render loads its imports)
                assert post_render(c, "/v1/lip-sync", clip).status_code == 200
            for i in range(requests):  # ABBA: neither side always goes first
                pair = ((True, c_on), (False, c_off))
                for guarded, c in pair if i % 2 == 0 else pair[::-1]:
                    start = time.perf_counter()
                    answer = post_render(c, "/v1/lip-sync", clip)
                    times[guarded].append(time.perf_counter() - start)
                    assert answer.status_code == 200, answer.text
    (p50_on, p95_on), (p50_off, p95_off) = percentiles(times[True]), percentiles(times[False])
    own_on, own_off = guard_cost_in_process(clip, 2000)
    own = own_on - own_off
    print(
        f"guard's cost on a hot POST /v1/lip-sync, {requests} requests each, alternating "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs):"
    )
    print(f"{'':>22} {'p50 s':>8} {'p95 s':>8}")
    print(f"{'without guard (base)':>22} {p50_off:>8.3f} {p95_off:>8.3f}")
    print(f"{'with guard':>22} {p50_on:>8.3f} {p95_on:>8.3f}")
    print(
        f"end to end: p50 {p50_on / p50_off:.3f}x, p95 {p95_on / p95_off:.3f}x the baseline "
        "(differences this small are within run-to-run noise)"
    )
    print(
        f"the guard's own time per request (in process, {clip.stat().st_size / 1e3:.0f} kB "
        f"form): {own * 1e6:.0f} us over the bare app's {own_off * 1e6:.0f} us "
        f"= {100 * own / p50_off:.4f}% of the request's p50"
    )


def audio_check_cost(root: Path, hours: float = 1.0, limit_s: float = 600.0) -> None:
    import tracemalloc

    from hotplate.serve.problems import Problem
    from hotplate.serve.uploads import check_audio
    from pipeline.render.audio import load_audio
    from tests.hotplate.serve_attacks import hide_flac_length, write_flac

    bomb = write_flac(root / "bomb.flac", hours * 3600)
    hidden = hide_flac_length(write_flac(root / "hidden.flac", 2 * limit_s, noise=True))

    def measure(fn) -> tuple[float, float]:
        tracemalloc.start()
        start = time.perf_counter()
        try:
            fn()
        except Problem:
            pass
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return took, peak

    print("peak = traced Python and numpy allocations (PyAV's own frame buffers are not traced)")
    print(f"audio check on {hours:g} h of silence in a {bomb.stat().st_size / 1e3:.0f} kB FLAC:")
    whole = measure(lambda: load_audio(bomb, 16000).size / 16000 > limit_s)
    new = measure(lambda: check_audio(bomb, "bomb.flac", limit_s))
    print(f"  decode whole (before, baseline)  {whole[0]:7.3f} s  {whole[1] / 1e6:8.1f} MB peak")
    print(
        f"  header claim (check_audio)       {new[0]:7.3f} s  {new[1] / 1e6:8.1f} MB peak"
        f"   = {new[0] / whole[0]:.1e}x the time"
    )
    seconds = 2 * limit_s
    whole = measure(lambda: load_audio(hidden, 16000).size / 16000 > limit_s)
    new = measure(lambda: check_audio(hidden, "hidden.flac", limit_s))
    print(f"a {seconds:g} s noisy FLAC whose header hides its length (limit {limit_s:g} s):")
    print(f"  decode whole (before, baseline)  {whole[0]:7.3f} s  {whole[1] / 1e6:8.1f} MB peak")
    print(
        f"  frame by frame, stop at limit    {new[0]:7.3f} s  {new[1] / 1e6:8.1f} MB peak"
        f"   = {new[0] / whole[0]:.2f}x the time"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=8, help="per concurrency level")
    parser.add_argument("--repeats", type=int, default=4, help="in-process baseline calls")
    parser.add_argument("--guard-requests", type=int, default=20, help="per side, step 3")
    parser.add_argument("--only-guard", action="store_true", help="step 3 alone")
    parser.add_argument("--only-audio", action="store_true", help="step 4 alone")
    parser.add_argument("--serve-child", nargs=2, metavar=("ROOT", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--no-guard", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_child:
        return serve_child(Path(args.serve_child[0]), int(args.serve_child[1]), not args.no_guard)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.only_audio:
        with tempfile.TemporaryDirectory(prefix="bench-serve-audio-") as tmp:
            return audio_check_cost(Path(tmp))
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        root = Path(tmp)
        clip = make_hot_avatar(root)
        if args.only_guard:
            return guard_cost(root, clip, args.guard_requests)
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
    with tempfile.TemporaryDirectory(prefix="bench-serve-guard-") as tmp:
        root = Path(tmp)
        guard_cost(root, make_hot_avatar(root), args.guard_requests)
        audio_check_cost(root)


if __name__ == "__main__":
    main()
