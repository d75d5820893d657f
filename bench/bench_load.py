"""A studio's day on one `hotplate serve`, driven by Locust. Run: python bench/bench_load.py

Locust, used as a library and headless, plays editors against real servers on loopback.
Each editor loops over a mix: a hot render of a --clip-seconds clip (POST /v1/lip-sync,
the MP4 back), a stream of one (POST /v1/lip-sync/stream, read to its last fragment),
catalog polls (GET /v1/personas) and thumbnails, with a short pause between; an editor
refused with 503 waits its Retry-After before going on, as the page does.

1. **Bursts** on a server of its own (--burst-workers 1, --burst-max-wait 3 s): --burst
   (12) renders of a --burst-clip-seconds clip sent at the same moment, first on the
   server fresh from its start (cold: it has rendered only its warm-up clips), then again
   once that burst is done (warm: it has measured the renders). Per burst: how many were
   served and refused, and for each refusal the error of its Retry-After, |advertised -
   actual| / actual, where actual is from the refusal to the end of the last admitted
   render (the job records' times): when a request sent again would start at once.
   The cold burst's baseline is the warm one, side by side on the same server.
2. **Sweeps** of 1, 2, 4 and 8 concurrent editors (--levels), --level-seconds each, on two
   servers started side by side from the same store: the server as users run it
   (admission: --max-wait 30 s) and the baseline, the same server with admission off (an
   unbounded queue: --max-wait off, --queue-size 100000). Levels alternate between them,
   so both meet the same load on the machine. Per level and server: p50/p95/p99 latency
   per route (answers 200 only), throughput (work answered per second), the share of
   503s, the real-time factor of each stream (audio seconds over the stream's seconds
   from request to last byte: >= 1 keeps up), and the p95 of the first fragment.
3. **A soak** of --soak-minutes (10; --quick 8 s) at --soak-editors on the admission
   server, sampling every --sample-seconds the server's and its workers' memory (RSS),
   descriptors and threads and the data dir's size: the figures are slopes fitted over
   the samples after the first fifth (warm-up), and the first and last readings. The
   servers keep videos --keep-videos (1m) so the data dir reaches its plateau in a soak.

Requests go only to 127.0.0.1; every phase is bounded in time and stops by itself. A
request that fails (not 200, not a 503 with Retry-After) is counted and printed, and any
fails the run (exit 1) after the figures. Prints figures; asserts nothing else.
"""

from __future__ import annotations

# ruff: noqa: E402, I001 - Locust patches the standard library (gevent) when imported, so
# it comes first and the rest after it
from locust import HttpUser, between, task
from locust.env import Environment
from locust.exception import StopUser

import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import gevent
import gevent.event
import numpy as np
import psutil
import requests

from harness import Bench, run_bench
from hotplate.cli.common import invocation
from hotplate.serve.records import dir_bytes

ROUTES = ("render", "stream", "catalog", "thumbnail")
READY_TIMEOUT = 300.0
STOP_TIMEOUT = 600.0  # at a level's end each editor finishes the request it has in flight
FAILURES: list[str] = []  # any fails the run


def add_arguments(ap) -> None:
    ap.add_argument("--levels", default="1,2,4,8", help="concurrent editors per sweep level")
    ap.add_argument("--level-seconds", type=float, default=60.0, help="load time per level")
    ap.add_argument("--soak-minutes", type=float, default=10.0)
    ap.add_argument("--soak-editors", type=int, default=2)
    ap.add_argument("--sample-seconds", type=float, default=5.0)
    ap.add_argument("--clip-seconds", type=float, default=5.0, help="audio of each render")
    ap.add_argument("--loop-frames", type=int, default=24)
    ap.add_argument("--resolution", default="1080x1920", help="WxH of the presenter loop")
    ap.add_argument("--workers", default="auto", help="the servers' --workers")
    ap.add_argument("--keep-videos", default="1m", help="the servers' --keep-videos")
    ap.add_argument("--burst", type=int, default=12, help="renders sent at once (0: none)")
    ap.add_argument("--burst-clip-seconds", type=float, default=1.0, help="audio of each")
    ap.add_argument("--burst-workers", type=int, default=1, help="the burst server's")
    ap.add_argument("--burst-max-wait", default="3s", help="the burst server's --max-wait")


# -- the world and the servers ---------------------------------------------------------


def make_world(root: Path, frames: int, size: tuple[int, int], clip_s: float) -> Path:
    """personas/astro/studio.mp4 made hot by `hotplate precompile` (its own process: Locust's
    patched threads must not run the pipeline), and the clip; returns the clip."""
    from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav

    loop = root / "personas" / "astro" / "studio.mp4"
    loop.parent.mkdir(parents=True)
    write_loop_video(loop, n_frames=frames, size=size)
    subprocess.run(
        [*cli(root), "precompile", str(loop)], check=True, capture_output=True, timeout=1800
    )
    return write_wav(root / "clip.wav", make_speech_audio(clip_s), 16000)


def write_clip(path: Path, seconds: float) -> Path:
    from hotplate.demo_data import make_speech_audio, write_wav

    return write_wav(path, make_speech_audio(seconds, seed=2), 16000)


def cli(root: Path) -> list[str]:
    return invocation(root / "personas", root / "cache")


class Server:
    """One `hotplate serve` process on a free loopback port, with its log beside it."""

    def __init__(self, root: Path, name: str, args: list[str]) -> None:
        self.name, self.root = name, root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = root / f"data-{name}"
        self.log = open(root / f"serve-{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        cmd = [*cli(root), "serve", "--port", str(self.port), "--data", str(self.data), *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited: {self.log_tail()}")
            try:
                if requests.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            gevent.sleep(0.2)
        raise RuntimeError(f"server {self.name} not ready in {READY_TIMEOUT} s")

    def processes(self) -> list[psutil.Process]:
        try:
            top = psutil.Process(self.proc.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def sample(self) -> dict:
        """Memory (MB), descriptors and threads of the server and its workers; data dir MB."""
        rss = fds = threads = 0
        for p in self.processes():
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    fds += p.num_fds()
                    threads += p.num_threads()
            except psutil.NoSuchProcess:
                continue
        return {
            "t": time.monotonic(),
            "rss_mb": rss / 1e6,
            "fds": fds,
            "threads": threads,
            "data_mb": dir_bytes(self.data) / 1e6,
        }

    def log_tail(self) -> str:
        return (self.root / f"serve-{self.name}.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the editors (Locust users) --------------------------------------------------------


class Tally:
    """What one run's requests did: latencies of 200s per route, 503s, failures, streams."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.refused: dict[str, int] = defaultdict(int)
        self.failed: list[str] = []
        self.rtf: list[float] = []
        self.first_fragment: list[float] = []

    def on_request(self, request_type, name, response_time, response_length, response=None,
                   exception=None, context=None, **_):  # fmt: skip
        if name not in ROUTES:
            return
        status = getattr(response, "status_code", None)
        if exception is None and status == 200:
            self.latency[name].append(response_time / 1000)
        elif status == 503 and response.headers.get("Retry-After", "").isdigit():
            self.refused[name] += 1
        else:
            self.failed.append(f"{name}: {status} {exception or ''}"[:200])


def editor_class(clip: Path, clip_s: float, tally: Tally) -> type[HttpUser]:
    audio = clip.read_bytes()
    form = {"persona": "astro", "attire": "studio"}

    class Editor(HttpUser):
        wait_time = between(0.2, 1.0)  # an editor reads, listens, clicks
        network_timeout = connection_timeout = 900.0  # the baseline's queue is unbounded

        @task(2)
        def render(self) -> None:
            files = {"audio": ("clip.wav", audio, "audio/wav")}
            with self.client.post(
                "/v1/lip-sync", data=form, files=files, name="render", catch_response=True
            ) as r:
                if r.status_code == 200 and r.content[4:8] != b"ftyp":
                    r.failure("not an MP4")
                elif r.status_code in (200, 503):
                    r.success()
            come_back(r)

        @task(2)
        def stream(self) -> None:
            files = {"audio": ("clip.wav", audio, "audio/wav")}
            start = time.perf_counter()
            with self.client.post(
                "/v1/lip-sync/stream",
                data=form,
                files=files,
                name="stream",
                stream=True,
                catch_response=True,
            ) as r:
                if r.status_code != 200:
                    if r.status_code == 503:
                        r.success()
                    come_back(r)
                    return
                first, boxes = first_fragment_reader()
                for chunk in r.iter_content(1 << 16):
                    if first() is None and boxes(chunk):
                        tally.first_fragment.append(time.perf_counter() - start)
                took = time.perf_counter() - start
                r.request_meta["response_time"] = took * 1000  # until the last byte
                if first() is None:
                    r.failure("the stream ended without a fragment")
                    return
                tally.rtf.append(clip_s / took)
                r.success()

        @task(4)
        def catalog(self) -> None:
            self.client.get("/v1/personas", name="catalog")

        @task(4)
        def thumbnail(self) -> None:
            self.client.get("/v1/personas/astro/studio/thumbnail.jpg", name="thumbnail")

    return Editor


def come_back(response) -> None:
    """A refused editor waits its Retry-After, as the page does, before its next request."""
    after = response.headers.get("Retry-After", "") if response.status_code == 503 else ""
    if after.isdigit():
        gevent.sleep(int(after))


def first_fragment_reader():
    """(seen, feed): feed(chunk) returns True when the first moof box has arrived."""
    buf, state = bytearray(), {"first": None}

    def feed(chunk: bytes) -> bool:
        buf.extend(chunk)
        while len(buf) >= 8:
            size, kind = struct.unpack(">I4s", buf[:8])
            if kind == b"moof":
                state["first"] = True
                return True
            if size < 8 or len(buf) < size:
                return False
            del buf[:size]
        return False

    return (lambda: state["first"]), feed


class BurstAnswers:
    """What each request of a burst got: status, Retry-After (whole and unrounded), job,
    and the wall time its answer ended (the job records use the same clock)."""

    def __init__(self, n: int) -> None:
        self.n, self.got, self.go = n, [], gevent.event.Event()


def burst_class(clip: Path, answers: BurstAnswers) -> type[HttpUser]:
    audio = clip.read_bytes()
    form = {"persona": "astro", "attire": "studio"}

    class Sender(HttpUser):
        wait_time = between(0, 0)
        network_timeout = connection_timeout = 600.0

        @task
        def render(self) -> None:
            answers.go.wait()  # every sender up: they POST at the same moment
            files = {"audio": ("clip.wav", audio, "audio/wav")}
            with self.client.post(
                "/v1/lip-sync", data=form, files=files, name="burst", catch_response=True
            ) as r:
                r.success()
            got = {"status": r.status_code, "at": time.time(), "job": None, "retry": None}
            if r.status_code == 200:
                got["job"] = r.headers.get("X-Hotplate-Job")
            elif r.status_code == 503:
                got["retry"] = int(r.headers.get("Retry-After", "0") or 0)
                got["retry_s"] = r.json().get("retry_after_seconds")
            answers.got.append(got)
            raise StopUser()

    return Sender


def run_burst(server: Server, n: int, clip: Path) -> dict:
    """`n` renders of `clip` at once; served, refused and each refusal's Retry-After
    against the end of the last admitted render."""
    answers = BurstAnswers(n)
    env = Environment(user_classes=[burst_class(clip, answers)], host=server.url)
    runner = env.create_local_runner()
    runner.start(n, spawn_rate=100)  # they wait for `go`: how fast they spawn is moot
    deadline = time.monotonic() + READY_TIMEOUT
    while runner.user_count < n and time.monotonic() < deadline:
        gevent.sleep(0.01)
    answers.go.set()
    while len(answers.got) < n and time.monotonic() < deadline:
        gevent.sleep(0.05)
    runner.quit()
    served = [g for g in answers.got if g["status"] == 200]
    refused = [g for g in answers.got if g["status"] == 503 and g["retry"]]
    other = [g for g in answers.got if g not in served and g not in refused]
    FAILURES.extend(f"burst: {g['status']}" for g in other)
    jobs = [requests.get(f"{server.url}/v1/renders/{g['job']}").json() for g in served]
    drained = max((j["finished"] for j in jobs), default=float("nan"))
    errors = [abs(g["retry"] - (drained - g["at"])) / (drained - g["at"]) for g in refused]
    return {
        "served": len(served),
        "refused": len(refused),
        "retry_after": [g["retry"] for g in refused],
        "actual": [drained - g["at"] for g in refused],
        "errors": errors,
        "render_s": [j["finished"] - j["started"] for j in jobs],
    }


def bursts(bench: Bench, root: Path, args, clip: Path, inputs: dict) -> list[str]:
    """The cold and the warm burst on a server of their own (module doc); table rows."""
    flags = ["--workers", str(args.burst_workers), "--max-wait", args.burst_max_wait]
    server = Server(root, "burst", [*flags, "--keep-videos", args.keep_videos])
    try:
        server.wait_ready()
        log = (root / "serve-burst.log").read_text(errors="replace")
        warm_up = (log.split("warm-up render, ")[1:2] or ["none (nothing hot)"])[0].splitlines()[0]
        took = re.search(r"warm-up took ([0-9.]+) s", log)
        print(f"  burst server's warm-up render: {warm_up}", flush=True)
        results = {"cold": run_burst(server, args.burst, clip)}
        results["warm"] = run_burst(server, args.burst, clip)
    finally:
        server.stop()
    at = {**inputs, "audio_seconds": args.burst_clip_seconds, "burst": args.burst,
          "workers": args.burst_workers, "max_wait": args.burst_max_wait}  # fmt: skip
    warm, rows = results["warm"], []
    if took is not None:
        bench.figure("burst server: warm-up before ready", float(took[1]), "s", better="lower",
                     inputs=at, note=f"its renders' cost: {warm_up}")  # fmt: skip
    for label, r in results.items():
        base = {} if label == "warm" else {"baseline": "the warm burst, same server"}
        what = f"{args.burst} renders of {args.burst_clip_seconds:g} s at once"
        bench.figure(f"{label} burst: served", r["served"], "renders", inputs=at, note=what,
                     **base, **({"baseline_value": warm["served"]} if base else {}))  # fmt: skip
        bench.figure(f"{label} burst: refused", r["refused"], "renders", better="lower",
                     inputs=at, note="503 with Retry-After")  # fmt: skip
        for name, pick in (("median", np.median), ("worst", np.max)):
            value = float(pick(r["errors"])) if r["errors"] else float("nan")
            bench.figure(
                f"{label} burst: Retry-After error {name}",
                value,
                "share",
                better="lower",
                inputs=at,
                note="|advertised - actual| / actual; actual: to the last admitted render's end"
                if r["errors"]
                else "nothing refused",
            )
        rows.append(burst_row(label, r))
    return rows


def burst_row(label: str, r: dict) -> str:
    med = lambda v: f"{np.median(v):.2f}" if v else "-"  # noqa: E731
    errors = r["errors"]
    cells = [
        label,
        str(r["served"]),
        str(r["refused"]),
        med(r["retry_after"]),
        med(r["actual"]),
        f"{np.median(errors):.0%} / {max(errors):.0%}" if errors else "-",
        med(r["render_s"]),
    ]
    return "| " + " | ".join(cells) + " |"


BURST_HEAD = (
    "| burst | served | refused | Retry-After s (median) | drained in s (median) | "
    "Retry-After error median / worst | render s (median) |\n| --- | --- | --- | --- | --- | --- | --- |"
)


def run_editors(server: Server, editors: int, seconds: float, clip: Path, clip_s: float):
    """`editors` Locust users on `server` for `seconds`; returns the Tally and the wall."""
    tally = Tally()
    env = Environment(
        user_classes=[editor_class(clip, clip_s, tally)], host=server.url, stop_timeout=STOP_TIMEOUT
    )
    env.events.request.add_listener(tally.on_request)
    runner = env.create_local_runner()
    start = time.perf_counter()
    runner.start(editors, spawn_rate=editors)
    gevent.sleep(seconds)
    runner.stop()  # each user ends its request in flight first (stop_timeout)
    runner.quit()
    return tally, time.perf_counter() - start


# -- figures ---------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def table_row(label: str, editors: int, tally: Tally, wall: float) -> str:
    """One line of the README's table: what an editor sees at this level."""
    lat = tally.latency
    work = len(lat["render"]) + len(lat["stream"])
    refused = tally.refused["render"] + tally.refused["stream"]
    three = lambda r: "/".join(f"{pct(lat[r], q):.2f}" for q in (50, 95, 99))  # noqa: E731
    cells = [
        label,
        str(editors),
        three("render"),
        three("stream"),
        f"{pct(lat['catalog'], 95) * 1000:.0f} / {pct(lat['thumbnail'], 95) * 1000:.0f} ms",
        f"{work / wall * 60:.1f}",
        f"{100 * refused / (work + refused) if work + refused else 0:.0f}%",
        f"{pct(tally.rtf, 50):.2f} ({min(tally.rtf) if tally.rtf else float('nan'):.2f})",
        f"{pct(tally.first_fragment, 95):.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


TABLE_HEAD = (
    "| server | editors | render p50/p95/p99 s | stream p50/p95/p99 s | catalog / thumbnail "
    "p95 | work/min | 503s | stream RTF p50 (worst) | first fragment p95 s |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def report_level(bench: Bench, label: str, editors: int, tally: Tally, wall: float, inputs):
    at = {**inputs, "editors": editors, "server": label}
    for route in ROUTES:
        times = tally.latency[route]
        for q in (50, 95, 99):
            bench.figure(
                f"{label}, {editors} editor(s): {route} p{q}",
                pct(times, q),
                "s",
                better="lower",
                inputs=at,
                note=f"{len(times)} answered",
            )
    work = len(tally.latency["render"]) + len(tally.latency["stream"])
    refused = tally.refused["render"] + tally.refused["stream"]
    bench.figure(f"{label}, {editors} editor(s): throughput", work / wall, "work/s", inputs=at,
                 note="renders + streams answered whole, per second")  # fmt: skip
    bench.figure(
        f"{label}, {editors} editor(s): share of 503s",
        refused / (work + refused) if work + refused else 0.0,
        "share",
        better="lower",
        inputs=at,
        note=f"{refused} of {work + refused} renders and streams",
    )
    rtf = tally.rtf
    bench.figure(
        f"{label}, {editors} editor(s): stream real-time factor p50",
        pct(rtf, 50),
        "x",
        inputs=at,
        note=f"each stream: {' '.join(f'{x:.2f}' for x in rtf) or 'none'}",
    )
    bench.figure(
        f"{label}, {editors} editor(s): stream real-time factor worst",
        min(rtf) if rtf else float("nan"),
        "x",
        inputs=at,
    )
    bench.figure(
        f"{label}, {editors} editor(s): first fragment p95",
        pct(tally.first_fragment, 95),
        "s",
        better="lower",
        inputs=at,
        note=f"{len(tally.first_fragment)} streams",
    )


def slope(samples: list[dict], key: str) -> float:
    """Least-squares slope of `key` per minute over the samples after the warm-up fifth."""
    kept = samples[len(samples) // 5 :]
    if len(kept) < 2:
        return float("nan")
    t = np.array([s["t"] for s in kept]) / 60.0
    y = np.array([s[key] for s in kept])
    return float(np.polyfit(t - t[0], y, 1)[0])


def soak(bench: Bench, server: Server, minutes: float, editors: int, every: float, clip, clip_s,
         inputs) -> Tally:  # fmt: skip
    samples: list[dict] = []

    def sampler() -> None:
        while True:
            samples.append(server.sample())
            gevent.sleep(every)

    watcher = gevent.spawn(sampler)
    tally, _wall = run_editors(server, editors, minutes * 60, clip, clip_s)
    gevent.sleep(every)  # one reading after the load stops
    watcher.kill()
    at = {**inputs, "editors": editors, "soak_minutes": minutes, "samples": len(samples)}
    first, last = samples[0], samples[-1]
    for key, unit, name in (
        ("rss_mb", "MB/min", "memory (RSS, server + workers)"),
        ("fds", "fds/min", "descriptors"),
        ("threads", "threads/min", "threads"),
        ("data_mb", "MB/min", "data dir"),
    ):
        bench.figure(
            f"soak: {name} slope",
            slope(samples, key),
            unit,
            better="lower",
            inputs=at,
            note=f"first {first[key]:.1f}, last {last[key]:.1f}, "
            f"max {max(s[key] for s in samples):.1f}",
        )
    answered = sum(len(v) for v in tally.latency.values())
    bench.figure("soak: requests answered", answered, "requests", inputs=at,
                 note=f"{sum(tally.refused.values())} refused with 503")  # fmt: skip
    return tally


def stop_on_signals() -> None:
    """Ctrl-C or SIGTERM ends the run at once, servers stopped (gevent's hub would hold
    Python's KeyboardInterrupt until the greenlet it waits on wakes)."""
    import signal

    main = gevent.getcurrent()
    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, lambda: main.throw(KeyboardInterrupt()))


def sweeps_and_soak(bench: Bench, root: Path, levels: list[int], clip: Path, inputs: dict):
    """Phases 2 and 3 (module doc) on the admission server and the baseline; table rows."""
    a = bench.args
    common = ["--workers", str(a.workers), "--keep-videos", a.keep_videos]
    servers = {
        "admission": Server(root, "admission", common),
        "baseline (admission off)": Server(
            root, "baseline", [*common, "--max-wait", "off", "--queue-size", "100000"]
        ),
    }
    rows: list[str] = []
    try:
        for s in servers.values():
            s.wait_ready()
        inputs["workers"] = requests.get(servers["admission"].url + "/readyz").json()["workers"]
        for editors in levels:
            for label, server in servers.items():
                tally, wall = run_editors(server, editors, a.level_seconds, clip, a.clip_seconds)
                report_level(bench, label, editors, tally, wall, inputs)
                rows.append(table_row(label, editors, tally, wall))
                FAILURES.extend(f"{label}, {editors}: {f}" for f in tally.failed)
                print(f"  load average: {os.getloadavg()[0]:.2f}", flush=True)
        if a.soak_minutes > 0:
            tally = soak(bench, servers["admission"], a.soak_minutes, a.soak_editors,
                         a.sample_seconds, clip, a.clip_seconds, inputs)  # fmt: skip
            FAILURES.extend(f"soak: {f}" for f in tally.failed)
    finally:
        for s in servers.values():
            s.stop()
    return rows


def main(bench: Bench) -> None:
    stop_on_signals()
    a = bench.args
    levels = [int(x) for x in a.levels.split(",") if x.strip()]
    soak_min, frames = a.soak_minutes, a.loop_frames
    w, h = (int(x) for x in a.resolution.lower().split("x"))
    inputs = {"loop_frames": frames, "resolution": f"{w}x{h}", "audio_seconds": a.clip_seconds,
              "renderer": "warp", "recipe": "default", "workers": a.workers}  # fmt: skip
    print(f"load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        root = Path(tmp)
        clip = make_world(root, frames, (w, h), a.clip_seconds)
        burst_clip = write_clip(root / "burst.wav", a.burst_clip_seconds)
        burst_rows = bursts(bench, root, a, burst_clip, inputs) if a.burst else []
        print(f"  load average: {os.getloadavg()[0]:.2f}", flush=True)
        rows = sweeps_and_soak(bench, root, levels, clip, inputs) if levels or soak_min else []
    if burst_rows:
        print(f"\n{BURST_HEAD}", *burst_rows, sep="\n")
    if rows:
        print(f"\n{TABLE_HEAD}", *rows, sep="\n")
    print(f"\nload average at end: {os.getloadavg()}", flush=True)
    if FAILURES:
        print(f"{len(FAILURES)} failed request(s):", *FAILURES[:20], sep="\n  ", file=sys.stderr)


if __name__ == "__main__":
    quick = {"levels": "1,2", "level_seconds": 2.0, "soak_minutes": 8 / 60, "loop_frames": 8}
    quick |= {"sample_seconds": 2.0, "resolution": "270x480", "keep_videos": "10s"}
    # about 0.7 s a render at 270x480: 8 at once queue past the 3 s wait, so some are refused
    quick |= {"burst_clip_seconds": 5.0, "burst": 8}
    run_bench(main, __doc__, add_arguments, quick=quick)
    sys.exit(1 if FAILURES else 0)  # a failed request fails the run, after the figures
