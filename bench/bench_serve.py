"""`hotplate serve` against an in-process render. Run: python bench/bench_serve.py

For one hot avatar (a 540x960 loop, 16 frames) and a `--clip-seconds` speech clip (4 s):
1. overhead: median latency of POST /v1/lip-sync at concurrency 1 (upload, checks,
   queue, worker, MP4 back over loopback) over the median of `lip_sync()` called in
   this process (the baseline: the same entry point, no HTTP, no worker hop), as a ratio;
2. throughput: requests/s and p50/p95 latency at concurrency 1, 2 and 4 with --workers
   render workers (default 2: this machine has 2 cores); a failed request fails the run;
3. the guard's cost (hotplate/serve/guard.py): p50/p95 of POST /v1/lip-sync on a server
   with the guard and on the same app with it removed (the baseline), one worker each,
   requests alternating between them so both share the machine's load; and the guard's
   own time per request, measured in this process around an app that reads the same
   multipart body, as a share of the request's p50;
4. the audio check on a bomb (`--bomb-hours` of silence in a FLAC of a few hundred kB),
   and on a noisy FLAC of twice `--audio-limit` whose header hides its length, in this
   process: uploads.check_audio (header, then frame by frame up to the limit) against
   decoding the clip whole with load_audio (the check before issue #17, the baseline):
   seconds and peak traced memory of each.

Requests go only to 127.0.0.1 and are bounded (--requests per concurrency level). The
servers and the hostile FLACs come from what the tests use too (testkit/serve_helpers.py,
serve_attacks.py), so the bench drives the server as the tests do.
Figures only; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import Bench, run_bench

from hotplate import demo_data as synthetic
from testkit.serve_helpers import Server, post_render

SIZE = (540, 960)
FRAMES = 16
INPUTS = {"loop_frames": FRAMES, "resolution": f"{SIZE[0]}x{SIZE[1]}", "renderer": "warp"}


def make_hot_avatar(root: Path, clip_seconds: float) -> Path:
    """personas/astro/studio.mp4, precompiled into root/cache; returns the clip."""
    from cachestore.store import forget_store, open_store
    from pipeline.precompile.recipe import Recipe
    from pipeline.precompile.run import precompile

    loop = root / "personas" / "astro" / "studio.mp4"
    loop.parent.mkdir(parents=True)
    synthetic.write_loop_video(loop, n_frames=FRAMES, size=SIZE)
    precompile(loop, Recipe(), open_store(root / "cache"))
    forget_store(root / "cache")
    return synthetic.write_wav(root / "clip.wav", synthetic.make_speech_audio(clip_seconds), 16000)


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
        if outcome.jit:
            raise SystemExit("the avatar should be hot, and lip_sync precompiled it")
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


def guard_cost(bench: Bench, root: Path, clip: Path, requests: int, own_repeats: int) -> None:
    with ChildServer(root, guarded=True) as on, ChildServer(root, guarded=False) as off:
        times: dict[bool, list[float]] = {True: [], False: []}
        with on.client() as c_on, off.client() as c_off:
            for c in (c_on, c_off):  # warm each worker (first render loads its imports)
                warm = post_render(c, "/v1/lip-sync", clip)
                if warm.status_code != 200:
                    raise SystemExit(f"POST /v1/lip-sync: {warm.status_code} {warm.text[:200]}")
            for i in range(requests):  # ABBA: neither side always goes first
                pair = ((True, c_on), (False, c_off))
                for guarded, c in pair if i % 2 == 0 else pair[::-1]:
                    start = time.perf_counter()
                    answer = post_render(c, "/v1/lip-sync", clip)
                    times[guarded].append(time.perf_counter() - start)
                    if answer.status_code != 200:
                        raise SystemExit(f"POST /v1/lip-sync: {answer.status_code} {answer.text}")
    (p50_on, p95_on), (p50_off, p95_off) = percentiles(times[True]), percentiles(times[False])
    own_on, own_off = guard_cost_in_process(clip, own_repeats)
    own = own_on - own_off
    print(f"guard's cost on a hot POST /v1/lip-sync, {requests} requests each, alternating")
    inputs = {**INPUTS, "audio_seconds": bench.args.clip_seconds, "requests": requests}
    base = "the same app with the guard removed, one worker, requests alternating (ABBA)"
    for which, on, off in (("p50", p50_on, p50_off), ("p95", p95_on, p95_off)):
        bench.figure(
            f"hot POST /v1/lip-sync with the guard, {which}",
            on,
            "s",
            baseline=base,
            baseline_value=off,
            better="lower",
            inputs=inputs,
            note="goal < 2%; differences this small are run-to-run noise",
        )
    bench.figure(
        "the guard's own time per request, in process",
        own * 1e6,
        "us",
        baseline="the request's p50 without the guard",
        baseline_value=p50_off * 1e6,
        better="lower",
        inputs={"form_kb": round(clip.stat().st_size / 1e3), "repeats": own_repeats},
        note=f"over the bare app's {own_off * 1e6:.0f} us",
    )


def audio_check_cost(bench: Bench, root: Path, hours: float, limit_s: float) -> None:
    import tracemalloc

    from hotplate.serve.problems import Problem
    from hotplate.serve.uploads import check_audio
    from pipeline.render.audio import load_audio
    from testkit.serve_attacks import hide_flac_length, write_flac

    bomb = write_flac(root / "bomb.flac", hours * 3600)
    hidden = hide_flac_length(write_flac(root / "hidden.flac", 2 * limit_s, noise=True))

    def measure(fn) -> tuple[float, float, bool]:
        """(seconds, peak traced bytes, refused): refused when fn says so or raises 422."""
        tracemalloc.start()
        start = time.perf_counter()
        try:
            refused = fn() is True
        except Problem as e:
            refused = e.status == 422
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return took, peak, refused

    print("peak = traced Python and numpy allocations (PyAV's own frame buffers are not traced)")
    print(f"audio check on {hours:g} h of silence in a {bomb.stat().st_size / 1e3:.0f} kB FLAC:")
    before = "decoding the clip whole with load_audio (the check before issue #17)"
    cases = (
        (f"{hours:g} h of silence in a {bomb.stat().st_size / 1e3:.0f} kB FLAC", bomb),
        (f"a {2 * limit_s:g} s noisy FLAC whose header hides its length", hidden),
    )
    for what, path in cases:
        whole = measure(lambda p=path: load_audio(p, 16000).size / 16000 > limit_s)
        new = measure(lambda p=path: check_audio(p, p.name, limit_s))
        if not (whole[2] and new[2]):  # both must refuse the clip, or this times something else
            raise SystemExit(
                f"{what}: over the {limit_s:g} s limit, yet not refused: {new}, {whole}"
            )
        inputs = {"limit_seconds": limit_s}
        bench.figure(
            f"audio check (check_audio) on {what}: time",
            new[0],
            "s",
            baseline=before,
            baseline_value=whole[0],
            better="lower",
            inputs=inputs,
        )
        bench.figure(
            f"audio check (check_audio) on {what}: peak traced memory",
            new[1] / 1e6,
            "MB",
            baseline=before,
            baseline_value=whole[1] / 1e6,
            better="lower",
            inputs=inputs,
        )


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=8, help="per concurrency level")
    ap.add_argument("--repeats", type=int, default=4, help="in-process baseline calls")
    ap.add_argument("--clip-seconds", type=float, default=4.0, help="speech per request")
    ap.add_argument("--guard-requests", type=int, default=20, help="per side, step 3")
    ap.add_argument("--guard-repeats", type=int, default=2000, help="in-process, step 3")
    ap.add_argument("--bomb-hours", type=float, default=1.0, help="silence in the FLAC, step 4")
    ap.add_argument("--audio-limit", type=float, default=600.0, help="seconds, step 4")
    ap.add_argument("--only-guard", action="store_true", help="step 3 alone")
    ap.add_argument("--only-audio", action="store_true", help="step 4 alone")
    ap.add_argument("--serve-child", nargs=2, metavar=("ROOT", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--no-guard", action="store_true", help=argparse.SUPPRESS)


def main(bench: Bench) -> None:
    args = bench.args
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not args.only_guard:
        with tempfile.TemporaryDirectory(prefix="bench-serve-audio-") as tmp:
            audio_check_cost(bench, Path(tmp), args.bomb_hours, args.audio_limit)
    if args.only_audio:
        return
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        # the hot avatar is built once; each part's servers get a copy of its own
        hot = Path(tmp) / "hot"
        clip = make_hot_avatar(hot, args.clip_seconds).name
        if not args.only_guard:
            root = Path(shutil.copytree(hot, Path(tmp) / "throughput"))
            throughput(bench, root, root / clip)
        root = Path(shutil.copytree(hot, Path(tmp) / "guard"))
        guard_cost(bench, root, root / clip, args.guard_requests, args.guard_repeats)


def throughput(bench: Bench, root: Path, clip: Path) -> None:
    """1. and 2.: the server against lip_sync() in process, then concurrency 1, 2, 4."""
    args = bench.args
    baseline = statistics.median(in_process(root, clip, args.repeats))
    with Server(root, "--workers", str(args.workers), "--queue-size", "64") as server:
        with server.client() as c:  # warm every worker (first render loads its imports)
            for _ in range(args.workers):
                post_render(c, "/v1/lip-sync", clip)
        results = {n: load(server, clip, n, args.requests) for n in (1, 2, 4)}
    print(f"{'concurrency':>11} {'req/s':>7} {'p50 s':>7} {'p95 s':>7} {'failed':>7}")
    for n, r in results.items():
        print(f"{n:>11} {r['rps']:>7.2f} {r['p50']:>7.3f} {r['p95']:>7.3f} {len(r['failed']):>7}")
    failed = [f"concurrency {n}: {f}" for n, r in results.items() for f in r["failed"]]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed; first: {failed[0]}")
    inputs = {**INPUTS, "audio_seconds": args.clip_seconds, "workers": args.workers}
    bench.figure(
        "hot POST /v1/lip-sync, median latency at concurrency 1",
        results[1]["p50"],
        "s",
        baseline="lip_sync() called in this process (no HTTP, no worker hop), median",
        baseline_value=baseline,
        better="lower",
        inputs={**inputs, "requests": args.requests},
    )
    for n in (2, 4):
        bench.figure(
            f"hot POST /v1/lip-sync, throughput at concurrency {n}",
            results[n]["rps"],
            "requests/s",
            baseline="the same server at concurrency 1",
            baseline_value=results[1]["rps"],
            inputs={**inputs, "requests": args.requests},
            note=f"p50 {results[n]['p50']:.2f} s, p95 {results[n]['p95']:.2f} s, 0 failed",
        )


def entry() -> None:
    if "--serve-child" in sys.argv:  # the guard's baseline server, started by ChildServer
        i = sys.argv.index("--serve-child")
        root, port = Path(sys.argv[i + 1]), int(sys.argv[i + 2])
        return serve_child(root, port, "--no-guard" not in sys.argv)
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={
            "requests": 2,
            "repeats": 1,
            "clip_seconds": 1.0,
            "guard_requests": 2,
            "guard_repeats": 50,
            "bomb_hours": 0.05,
            "audio_limit": 30.0,
        },
    )


if __name__ == "__main__":
    entry()
