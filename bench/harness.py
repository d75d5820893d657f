"""What every bench shares: `--quick`, `--json FILE`, figures that name their baseline and
inputs, the machine they ran on, and a one-line failure when something cannot be measured.

A bench is a `main(bench)` function run by `run_bench`:

    def add_arguments(ap): ap.add_argument("--frames", type=int, default=250)

    def main(bench: Bench) -> None:
        frames = bench.args.frames  # 24 under --quick (below), unless --frames is given
        ...
        bench.figure("hot render, streamed", fps, "frames/s",
                     baseline="render_video before the change", baseline_value=old_fps,
                     inputs={"loop_frames": frames, "resolution": "1080x1920"})

    if __name__ == "__main__":
        run_bench(main, __doc__, add_arguments, quick={"frames": 24})

Rules the harness enforces, so that figures cannot rot:
- `--quick` runs the same code paths on small inputs (at most 60 s on 2 cores): a smoke
  run for CI, whose timings mean nothing. `quick={"frames": 24}` sets those inputs as the
  options' defaults under `--quick` (a flag given on the command line still wins), so a
  bench reads only `bench.args` and its quick sizes are listed in its `--help`.
- A bench that cannot measure what it names, its baseline included, calls
  `bench.missing("what is missing and how to get it")`: one line on stderr, exit 2. It
  never substitutes something else. testkit's `require` (a tool such as espeak-ng or
  nginx, the test faces) raises `testkit.preconditions.Missing`, which ends the same way.
- Every figure is printed as it is recorded, and written with the machine and the commit
  to `--json FILE` at the end (bench/tables.py turns those files into the README's tables).
  The machine's load average is sampled while the bench runs (start, end, highest), since
  a figure taken beside other work must say so.

Benches import only public names of the project (tests/test_benches.py reads every import
and attribute, so a moved module fails the suite). Some import testkit/ (what the tests
share with the benches: testkit/nginx.py, testkit/serve_helpers.py, ...), never tests/; the
same check covers those names. Timing helpers shared by benches are here: `timed`, `best_of`,
`median_of`, `cpu_seconds`, `psnr`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benches import the project (and testkit/) from the checkout
# and so does every process a bench starts (a server, the CLI): the venv's editable install
# may point at another checkout
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != str(ROOT):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
# A bench run as a script imports this as `harness`; one bench importing another, or the
# tests, may reach it as `bench.harness`: one module under both names, so that
# MissingPrecondition raised under one name is caught under the other.
sys.modules.setdefault("harness", sys.modules[__name__])
sys.modules.setdefault("bench.harness", sys.modules[__name__])

from testkit.preconditions import Missing  # noqa: E402 - after the checkout is on sys.path

SCHEMA = 1
LOAD_EVERY = 5.0  # seconds between load-average samples
T = TypeVar("T")


class MissingPrecondition(Missing):
    """Something a figure needs (a baseline, a package, weights) is not here."""


@dataclass
class Figure:
    """One measured number, with what it is compared with and what it was measured on."""

    name: str
    value: float
    unit: str
    baseline: str | None = None  # what users really run, named: "x264 superfast, today's path"
    baseline_value: float | None = None
    ratio: float | None = None  # value / baseline_value unless given
    better: str = "higher"  # "higher" or "lower": which way the value improves
    inputs: dict[str, Any] = field(default_factory=dict)  # loop_frames, resolution, ...
    note: str = ""

    def line(self) -> str:
        text = f"{self.name}: {_number(self.value)} {self.unit}"
        if self.baseline is not None:
            text += f"  vs {self.baseline}: {_number(self.baseline_value)} {self.unit}"
            if self.ratio is not None:
                text += f" ({ratio_text(self.ratio)})"
        shown = ", ".join(f"{k}={v}" for k, v in self.inputs.items())
        if shown:
            text += f"  [{shown}]"
        if self.note:
            text += f"  ({self.note})"
        return text


def ratio_text(ratio: float) -> str:
    """1.24x, 0.96x; three significant digits below 0.1 (0.00021x), so a small share shows."""
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if value == 0 or abs(value) >= 100 or value == int(value):
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """(wall seconds, result) of one call."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def best_of(fn: Callable[[], object], runs: int) -> float:
    """The fastest of `runs` calls, in wall seconds (warm caches: the floor, not the mean)."""
    return min(timed(fn)[0] for _ in range(runs))


def median_of(fn: Callable[[], object], runs: int) -> float:
    """The median of `runs` calls, in wall seconds."""
    return statistics.median(timed(fn)[0] for _ in range(runs))


def cpu_seconds() -> float:
    """CPU seconds this process has used, all threads (less moved by other load than wall
    time on a shared machine; thread pools that spin count too)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def psnr(a: np.ndarray, b: np.ndarray, keep: np.ndarray | None = None) -> float:
    """PSNR in dB of `b` against `a` (uint8 images), over the pixels where the (H, W)
    mask `keep` is true (all when None); identical pixels give inf."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if keep is not None:
        a, b = a[keep], b[keep]
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_start": list(os.getloadavg()),
    }


class LoadSampler:
    """The 1-minute load average, sampled every LOAD_EVERY seconds on a daemon thread."""

    def __init__(self) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(LOAD_EVERY):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> None:
        self._stop.set()
        self.samples.append(os.getloadavg()[0])


class Bench:
    """The figures of one run of one bench, and its options."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        self.quick: bool = bool(args.quick)
        self.figures: list[Figure] = []
        self.machine = machine()
        self.started = time.time()
        self.load = LoadSampler()

    def figure(
        self,
        name: str,
        value: float,
        unit: str,
        *,
        baseline: str | None = None,
        baseline_value: float | None = None,
        ratio: float | None = None,
        better: str = "higher",
        inputs: dict[str, Any] | None = None,
        note: str = "",
    ) -> Figure:
        """Record and print one figure; `ratio` defaults to value / baseline_value."""
        if better not in ("higher", "lower"):
            raise ValueError(f"better={better!r}: use 'higher' or 'lower'")
        if baseline_value is not None and baseline is None:
            raise ValueError(f"figure {name!r}: a baseline value needs its baseline named")
        if ratio is None and baseline_value:
            ratio = float(value) / float(baseline_value)
        fig = Figure(
            name,
            float(value),
            unit,
            baseline,
            None if baseline_value is None else float(baseline_value),
            ratio,
            better,
            dict(inputs or {}),
            note,
        )
        self.figures.append(fig)
        print(fig.line(), flush=True)
        return fig

    def missing(self, what: str) -> NoReturn:
        """This bench cannot measure what it names: say what is missing, exit non-zero."""
        raise MissingPrecondition(what)

    def result(self) -> dict[str, Any]:
        self.load.stop()
        return {
            "schema": SCHEMA,
            "bench": self.name,
            "quick": self.quick,
            "argv": sys.argv[1:],
            "commit": git_commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "seconds": round(time.time() - self.started, 1),
            "machine": {
                **self.machine,
                "load_end": list(os.getloadavg()),
                "load_max": max(self.load.samples),
            },
            "figures": [asdict(f) for f in self.figures],
        }


def _shown(value: Any) -> str:
    """An option's value as it would be typed: 0.333 for 20 / 60, `12 24` for [12, 24]."""
    if isinstance(value, list):
        return " ".join(map(_shown, value))
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def run_bench(
    main: Callable[[Bench], None],
    doc: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: list[str] | None = None,
    quick: dict[str, Any] | None = None,
) -> None:
    """Parse the common options and the bench's own, run `main`, write `--json`.

    `quick`: the bench's options' defaults under `--quick` (its small inputs)."""
    name = Path(sys.argv[0]).stem.removeprefix("bench_")
    ap = argparse.ArgumentParser(
        description=(doc or "").strip().splitlines()[0] if doc else None,
        epilog=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the same code paths on small inputs, at most 60 s on 2 cores (CI's smoke run; "
        "its timings mean nothing)",
    )
    ap.add_argument("--json", type=Path, metavar="FILE", help="write every figure here as JSON")
    if add_arguments is not None:
        add_arguments(ap)
    if quick:
        ap.epilog = (
            (ap.epilog or "")
            + "\n--quick sets: "
            + ", ".join(f"--{k.replace('_', '-')} {_shown(v)}" for k, v in quick.items())
        )
    args = ap.parse_args(argv)
    if args.quick and quick:
        ap.set_defaults(**quick)  # the small inputs; flags given on the command line win
        args = ap.parse_args(argv)
    bench = Bench(name, args)
    print(
        f"== bench {name}{' (quick)' if bench.quick else ''}: {bench.machine['cpu']}, "
        f"{bench.machine['cores']} cores, load {bench.machine['load_start'][0]:.2f}, "
        f"commit {git_commit()}",
        flush=True,
    )
    try:
        main(bench)
    except Missing as e:  # bench.missing(...), or testkit's require(...)
        print(f"bench {name}: cannot measure: {e}", file=sys.stderr)
        sys.exit(2)
    if not bench.figures:
        print(f"bench {name}: measured nothing", file=sys.stderr)
        sys.exit(3)
    result = bench.result()
    load = result["machine"]
    print(
        f"== bench {name}: {result['seconds']:.0f} s, load {load['load_start'][0]:.2f} at start, "
        f"{load['load_end'][0]:.2f} at end, {load['load_max']:.2f} at most",
        flush=True,
    )
    if bench.args.json is not None:
        bench.args.json.parent.mkdir(parents=True, exist_ok=True)
        bench.args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {bench.args.json}", flush=True)
