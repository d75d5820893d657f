"""The watcher's latency and `hotplate sync`'s throughput. Run: python bench/bench_watcher.py

1. latency: a still is copied into a watched folder; the time from the end of the copy
   (the writer's close) to the daemon handing the precompile to a worker, as a multiple
   of the settle time (goal <= 1.2x), for inotify and polling, `--settles` settle times.
2. throughput: `hotplate sync --workers N` on a folder of 8 distinct stills and 3 loops
   (plus `--video PATH` if given), against `hotplate precompile a b c ...` on the same files
   in one process (the fair baseline: imports and models loaded once too) and against
   `hotplate precompile FILE` once per file in a fresh process.

Media are synthetic 540x960 presenter frames (hotplate/demo_data.py); loops have 16
frames. A copy that starts no job, or a command that fails, fails the run. Asserts nothing
about speed.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import ROOT, Bench, run_bench

from hotplate import demo_data as synthetic
from pipeline.precompile.recipe import Recipe

SIZE = (540, 960)
FRAMES = 16


def make_media(folder: Path, stills: int, loops: int) -> list[Path]:
    paths = []
    for i in range(stills):
        path = folder / f"p{i:02d}" / "portrait.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_still(path, size=SIZE, seed=i)
        paths.append(path)
    for i in range(loops):
        path = folder / f"p{i:02d}" / f"loop{i}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_loop_video(path, n_frames=FRAMES, size=SIZE, seed=100 + i)
        paths.append(path)
    return paths


# -- 1. latency ---------------------------------------------------------------------------


def latency(
    settle: float, polling: bool, copies: int, staging: list[Path], work: Path
) -> list[float]:
    from cachestore.store import forget_store
    from watcher.daemon import Config, Daemon

    personas, cache = work / "personas", work / "store"
    shutil.rmtree(work, ignore_errors=True)
    (personas / "ann").mkdir(parents=True)
    starts: dict[str, float] = {}

    def log(event: str, path: str = "", msg: str = "", **fields: object) -> None:
        if event == "job-start":
            starts[path] = time.time()

    daemon = Daemon(
        Config(
            personas,
            cache,
            recipe=Recipe(max_frames=FRAMES),
            settle=settle,
            polling=polling,
            poll_interval=0.1,
        ),
        log=log,
    )
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    time.sleep(2.0)  # the worker has spawned and imported
    ratios = []
    try:
        for i in range(copies):
            rel = f"ann/attire{i}.png"
            shutil.copyfile(staging[i], personas / rel)
            copied = time.time()
            deadline = time.monotonic() + 30 + settle
            while rel not in starts and time.monotonic() < deadline:
                time.sleep(0.005)
            if rel in starts:
                ratios.append((starts[rel] - copied) / settle)
            while daemon.jobs.jobs and time.monotonic() < deadline:  # let the job finish
                time.sleep(0.01)
    finally:
        daemon.stop()
        thread.join(timeout=30)
        forget_store(cache)
    return ratios


# -- 2. throughput ------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str]) -> tuple[float, str]:
    """(seconds, last line of stdout) of one hotplate command in a fresh process."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "hotplate.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"hotplate {' '.join(args[:3])} ... failed: {done.stderr.strip()}")
    lines = done.stdout.strip().splitlines()
    return time.perf_counter() - start, lines[-1] if lines else ""


def throughput(
    bench: Bench, work: Path, stills: int, loops: int, workers: list[int], video: Path | None
) -> None:
    personas = work / "personas"
    shutil.rmtree(work, ignore_errors=True)
    made = time.perf_counter()
    paths = make_media(personas, stills, loops)
    if video is not None:  # the user's own clip joins the folder, as one more persona
        (personas / "yours").mkdir(parents=True, exist_ok=True)
        paths.append(Path(shutil.copy(video, personas / "yours" / video.name)))
    made = time.perf_counter() - made
    env = {**os.environ, "HOTPLATE_MAX_FRAMES": str(FRAMES)}
    print(
        f"\n2. throughput: {stills} stills + {loops} loops of {FRAMES} frames, "
        f"{SIZE[0]}x{SIZE[1]} (made in {made:.1f} s)"
    )
    per_file = [cli("--cache", str(work / "each"), "precompile", str(p), env=env)[0] for p in paths]
    each = sum(per_file)
    print(
        f"   precompile, a fresh process per file  {each:7.1f} s  ({statistics.median(per_file):.2f} s median per file)"
    )
    one, _ = cli("--cache", str(work / "one"), "precompile", *map(str, paths), env=env)
    print(f"   precompile a b c ..., one process      {one:7.1f} s  (sequential, 1 worker)")
    inputs = {
        "stills": stills,
        "loops": loops,
        "loop_frames": FRAMES,
        "resolution": f"{SIZE[0]}x{SIZE[1]}",
        "recipe": "default",
    }
    for n in workers:
        cache = work / f"sync{n}"
        took, said = cli(
            "--personas", str(personas), "--cache", str(cache), "sync", "--workers", str(n), env=env
        )
        again, _ = cli("--personas", str(personas), "--cache", str(cache), "sync", env=env)
        print(f"      {said}")
        bench.figure(
            f"`hotplate sync --workers {n}`",
            took,
            "s",
            baseline="`hotplate precompile a b c ...` in one process (imports and models once)",
            baseline_value=one,
            better="lower",
            inputs=inputs,
            note=f"a second sync, all hot: {again:.2f} s",
        )
        bench.figure(
            f"`hotplate sync --workers {n}`",
            took,
            "s",
            baseline="`hotplate precompile FILE` in a fresh process per file",
            baseline_value=each,
            better="lower",
            inputs=inputs,
        )


def add_arguments(ap) -> None:
    ap.add_argument("--copies", type=int, default=3, help="copies per latency setting")
    ap.add_argument("--settles", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="seconds")
    ap.add_argument("--stills", type=int, default=8)
    ap.add_argument("--loops", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--video", type=Path, help="a video of yours to add to the synced folder")


def main(bench: Bench) -> None:
    args = bench.args
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-watcher-") as tmp:
        tmp = Path(tmp)
        # distinct content per copy: a copy of bytes that are hot already starts no job
        staging = make_media(tmp / "staging", args.copies, 0)
        print("\n1. latency: end of copy -> precompile handed to a worker, as a multiple of settle")
        for polling in (False, True):
            for settle in args.settles:
                ratios = latency(settle, polling, args.copies, staging, tmp / "lat")
                mode = "polling" if polling else "inotify"
                if len(ratios) < args.copies:
                    raise SystemExit(
                        f"{mode}, settle {settle:g} s: {args.copies - len(ratios)} of "
                        f"{args.copies} copies started no precompile"
                    )
                bench.figure(
                    f"watcher ({mode}): end of copy to precompile start, settle {settle:g} s",
                    statistics.median(ratios) * settle,
                    "s",
                    baseline="the settle time",
                    baseline_value=settle,
                    better="lower",
                    inputs={"copies": args.copies, "resolution": f"{SIZE[0]}x{SIZE[1]}"},
                    note=f"median; worst {max(ratios):.2f}x settle; goal <= 1.2x",
                )
        print(f"   ({time.perf_counter() - began:.0f} s so far)")
        throughput(bench, tmp / "tp", args.stills, args.loops, args.workers, args.video)


if __name__ == "__main__":
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={"copies": 1, "settles": [0.5], "stills": 2, "loops": 1, "workers": [2]},
    )
