"""The manual's benchmark tables (docs/benchmarks.md), generated from the benches' JSON results.

    .venv/bin/python bench/tables.py [--results bench/results] [--readme docs/benchmarks.md] [--check]
                                     [--only NAME ...]

docs/benchmarks.md marks each table with a pair of comments naming a bench (the file
bench/bench_NAME.py, whose `--json` result is RESULTS/NAME.json):

    <!-- bench:stream -->
    (whatever is here is replaced)
    <!-- /bench:stream -->

Between them this writes one line naming the run (command, commit, date, machine, load
average at start, end and highest) and a table of its figures: value, baseline (named,
with its value), the ratio, the loop length and the other inputs. A section whose result
is missing, or is a `--quick` smoke run (its timings mean nothing), gets one line saying
so and no figure: a figure with no result behind it does not appear. `--check` changes
nothing and exits 1 when the page is not what the results make (CI-friendly).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SECTION = re.compile(
    r"(?P<open><!-- bench:(?P<name>[a-z0-9_]+) -->)\n(?P<body>.*?)(?P<close><!-- /bench:(?P=name) -->)",
    re.S,
)
OPENER = re.compile(r"<!-- bench:([a-z0-9_]+) -->")
# inputs shown in their own column, or folded into the figure's line, in this order
SHOWN_INPUTS = ("resolution", "audio_seconds", "renderer", "recipe")


class TablesError(Exception):
    """README.md's markers or a result file are not what this script can use."""


def number(value: Any) -> str:
    """A figure's value as a person reads it: 3 significant digits, whole numbers whole."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return str(value)
    if value == 0 or value == int(value) and abs(value) < 1e6:
        return f"{int(value)}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def ratio_cell(fig: dict[str, Any]) -> str:
    """value / baseline, and for a lower-is-better figure clearly off 1, how many times
    less (or that it is worse)."""
    ratio = fig.get("ratio")
    if ratio is None:
        return "-"
    text = f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"
    if fig.get("better") == "lower" and 0 < ratio < 0.9:  # near 1 it is noise: no words
        text += f" ({1 / ratio:.1f}x less)"
    elif fig.get("better") == "lower" and ratio > 1.1:
        text += " (worse)"
    return text


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def loop_cell(inputs: dict[str, Any]) -> str:
    frames = inputs.get("loop_frames")
    return "not stated" if frames is None else f"{frames} frames"


def inputs_cell(inputs: dict[str, Any]) -> str:
    parts = []
    for key in SHOWN_INPUTS:
        if key in inputs:
            value = inputs[key]
            parts.append(f"{value} s audio" if key == "audio_seconds" else str(value))
    parts += [
        f"{k.replace('_', ' ')} {v}"
        for k, v in inputs.items()
        if k not in SHOWN_INPUTS and k != "loop_frames"
    ]
    return ", ".join(parts) or "-"


def run_line(result: dict[str, Any]) -> str:
    """Which run the table comes from: command, commit, date, machine and its load."""
    m = result.get("machine", {})
    load = (
        f"load average {m['load_start'][0]:.1f} at start, {m['load_end'][0]:.1f} at end"
        if m.get("load_start") and m.get("load_end")
        else "load average not recorded"
    )
    if m.get("load_max") is not None:
        load += f", {m['load_max']:.1f} at most"
    cmd = " ".join(["bench/bench_" + result["bench"] + ".py", *result.get("argv", [])])
    cmd = re.sub(r" --json \S+", "", cmd)
    return (
        f"`{cmd}` at commit `{result.get('commit', 'unknown')}`, "
        f"{result.get('started', 'unknown date')}, {result.get('seconds', '?')} s; "
        f"{m.get('cpu', 'unknown CPU')}, {m.get('cores', '?')} cores, {load}."
    )


def table(result: dict[str, Any]) -> str:
    rows = [
        "| figure | value | baseline | ratio | loop | inputs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for fig in result["figures"]:
        name = fig["name"] + (f" ({fig['note']})" if fig.get("note") else "")
        if fig.get("baseline") is None:
            baseline = "none named"
        else:
            baseline = fig["baseline"]
            if fig.get("baseline_value") is not None:
                baseline += f": {number(fig['baseline_value'])} {fig['unit']}"
        rows.append(
            "| "
            + " | ".join(
                cell(c)
                for c in (
                    name,
                    f"{number(fig['value'])} {fig['unit']}",
                    baseline,
                    ratio_cell(fig),
                    loop_cell(fig.get("inputs", {})),
                    inputs_cell(fig.get("inputs", {})),
                )
            )
            + " |"
        )
    return "\n".join(rows)


def section(name: str, results: Path) -> str:
    """The generated body between the markers of bench `name`."""
    path = results / f"{name}.json"
    note = f"<!-- generated by `just bench-tables` from {path.name}; edits here are lost -->"
    if not path.is_file():
        return f"{note}\nNo result yet: `just bench` writes it (bench/bench_{name}.py).\n"
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TablesError(f"{path} is not JSON ({e}); rerun bench/bench_{name}.py") from e
    if result.get("bench") != name or "figures" not in result:
        raise TablesError(f"{path} is not bench_{name}'s result; rerun bench/bench_{name}.py")
    if result.get("quick"):
        return (
            f"{note}\nOnly a `--quick` smoke run is in {path.name} (its timings mean nothing): "
            f"`just bench` writes the real one.\n"
        )
    return f"{note}\n{run_line(result)}\n\n{table(result)}\n"


def render(readme: str, results: Path, only: set[str] | None = None) -> str:
    """README text with every marked section (or those named in `only`) regenerated from
    `results`; the others are left as they are."""
    opened = OPENER.findall(readme)
    closed = set(re.findall(r"<!-- /bench:([a-z0-9_]+) -->", readme))
    unclosed = [n for n in opened if n not in closed]
    if unclosed:
        raise TablesError(
            f"the page opens <!-- bench:{unclosed[0]} --> and never closes it; "
            f"add <!-- /bench:{unclosed[0]} --> after it"
        )
    unknown = sorted((only or set()) - set(opened))
    if unknown:
        raise TablesError(f"the page has no <!-- bench:{unknown[0]} --> section")

    def one(m: re.Match) -> str:
        if only is not None and m["name"] not in only:
            return m[0]
        return f"{m['open']}\n{section(m['name'], results)}{m['close']}"

    return SECTION.sub(one, readme)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0], epilog=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--readme", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="rewrite only these benches' sections (a checkout holds only the results run "
        "in it: the others keep the tables they have)",
    )
    args = ap.parse_args(argv)
    try:
        before = args.readme.read_text()
        after = render(before, args.results, set(args.only) if args.only else None)
    except (OSError, TablesError) as e:
        print(f"bench tables: {e}", file=sys.stderr)
        return 2
    names = args.only or SECTION.findall(before)
    if args.check:
        if after != before:
            print(f"bench tables: {args.readme} is stale; run `just bench-tables`")
            return 1
        return 0
    if after != before:
        args.readme.write_text(after)
    print(f"bench tables: {len(names)} sections of {args.readme} from {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
