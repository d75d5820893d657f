"""What every bench shares: `--quick`, `--json FILE`, figures that name their baseline and
inputs, the machine they ran on, and a one-line failure when something cannot be measured.

A bench is a `main(bench)` function run by `run_bench`:

    def add_arguments(ap): ap.add_argument("--frames", type=int, default=250)

    def main(bench: Bench) -> None:
        frames = 24 if bench.quick else bench.args.frames
        ...
        bench.figure("hot render, streamed", fps, "frames/s",
                     baseline="render_video before the change", baseline_value=old_fps,
                     inputs={"loop_frames": frames, "resolution": "1080x1920"})

    if __name__ == "__main__":
        run_bench(main, __doc__, add_arguments)

Rules the harness enforces, so that figures cannot rot:
- `--quick` runs the same code paths on small inputs (at most 60 s on 2 cores): a smoke
  run for CI, whose timings mean nothing.
- A bench that cannot measure what it names, its baseline included, calls
  `bench.missing("what is missing and how to get it")`: one line on stderr, exit 2. It
  never substitutes something else.
- Every figure is printed as it is recorded, and written with the machine and the commit
  to `--json FILE` at the end (bench/tables.py turns those files into the README's tables).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benches import the project from the checkout

SCHEMA = 1


class MissingPrecondition(Exception):
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
                text += f" ({self.ratio:.2f}x)"
        shown = ", ".join(f"{k}={v}" for k, v in self.inputs.items())
        if shown:
            text += f"  [{shown}]"
        if self.note:
            text += f"  ({self.note})"
        return text


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


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


class Bench:
    """The figures of one run of one bench, and its options."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        self.quick: bool = bool(args.quick)
        self.figures: list[Figure] = []
        self.machine = machine()
        self.started = time.time()

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
        return {
            "schema": SCHEMA,
            "bench": self.name,
            "quick": self.quick,
            "argv": sys.argv[1:],
            "commit": git_commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "seconds": round(time.time() - self.started, 1),
            "machine": {**self.machine, "load_end": list(os.getloadavg())},
            "figures": [asdict(f) for f in self.figures],
        }


def run_bench(
    main: Callable[[Bench], None],
    doc: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: list[str] | None = None,
) -> None:
    """Parse the common options and the bench's own, run `main`, write `--json`."""
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
    bench = Bench(name, ap.parse_args(argv))
    print(
        f"== bench {name}{' (quick)' if bench.quick else ''}: {bench.machine['cpu']}, "
        f"{bench.machine['cores']} cores, load {bench.machine['load_start'][0]:.2f}, "
        f"commit {git_commit()}",
        flush=True,
    )
    try:
        main(bench)
    except MissingPrecondition as e:
        print(f"bench {name}: cannot measure: {e}", file=sys.stderr)
        sys.exit(2)
    if not bench.figures:
        print(f"bench {name}: measured nothing", file=sys.stderr)
        sys.exit(3)
    if bench.args.json is not None:
        bench.args.json.parent.mkdir(parents=True, exist_ok=True)
        bench.args.json.write_text(json.dumps(bench.result(), indent=1) + "\n")
        print(f"wrote {bench.args.json}", flush=True)
