"""bench/tables.py: the README's benchmark sections come from the benches' JSON results
alone, each figure with its baseline, loop length and machine, and nothing without one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import tables  # noqa: E402  (bench/tables.py)

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

README = """# project

prose above, kept as it is

<!-- bench:stream -->
| hand | typed | 44.8 fps |
<!-- /bench:stream -->

between the sections, kept

<!-- bench:render -->
old text
<!-- /bench:render -->

prose below
"""


def result(bench: str = "stream", quick: bool = False) -> dict:
    """A result as bench/harness.py writes it."""
    return {
        "schema": 1,
        "bench": bench,
        "quick": quick,
        "argv": ["--seconds", "20", "--json", f"bench/results/{bench}.json"],
        "commit": "abc123def456",
        "started": "2026-12-01T11:21:00Z",
        "seconds": 312.5,
        "machine": {
            "cpu": "AMD EPYC 7B13",
            "cores": 2,
            "python": "3.11.7",
            "load_start": [3.02, 2.5, 2.0],
            "load_end": [1.51, 2.0, 2.0],
            "load_max": 4.25,
        },
        "figures": [
            {
                "name": "hot warp render, streamed",
                "value": 44.8,
                "unit": "frames/s",
                "baseline": "today's renderer at 3d0c64b",
                "baseline_value": 36.0,
                "ratio": 44.8 / 36.0,
                "better": "higher",
                "inputs": {"loop_frames": 250, "resolution": "1080x1920", "audio_seconds": 20},
                "note": "goal >= 37.5 fps",
            },
            {
                "name": "time to the first fragment",
                "value": 0.263,
                "unit": "s",
                "baseline": "the whole render",
                "baseline_value": 11.2,
                "ratio": 0.263 / 11.2,
                "better": "lower",
                "inputs": {"loop_frames": 250, "renderer": "warp"},
                "note": "",
            },
            {
                "name": "a figure with no baseline",
                "value": 12.0,
                "unit": "ms",
                "baseline": None,
                "baseline_value": None,
                "ratio": None,
                "better": "lower",
                "inputs": {"threads": 8},
                "note": "",
            },
        ],
    }


def write(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{data['bench']}.json"
    path.write_text(json.dumps(data))
    return path


def between(text: str, name: str) -> str:
    return text.split(f"<!-- bench:{name} -->")[1].split(f"<!-- /bench:{name} -->")[0]


def test_a_section_shows_each_figure_with_baseline_loop_and_machine(tmp_path):
    write(tmp_path, result())
    out = tables.render(README, tmp_path)
    body = between(out, "stream")
    assert "hand | typed" not in body  # the hand-typed figure is gone
    assert "| hot warp render, streamed (goal >= 37.5 fps) | 44.8 frames/s |" in body
    assert "today's renderer at 3d0c64b: 36 frames/s | 1.24x |" in body
    assert "| 250 frames |" in body  # the loop length, in its own column
    assert "1080x1920, 20 s audio" in body
    assert "0.023x (42.6x less)" in body  # lower is better: how many times less
    assert "| none named |" in body  # a missing baseline is said, not left blank
    assert "| not stated |" in body  # and so is a loop length the bench did not give
    assert "threads 8" in body
    # the run: command (without --json), commit, date, machine, load
    assert "`bench/bench_stream.py --seconds 20` at commit `abc123def456`" in body
    assert "2026-12-01T11:21:00Z" in body
    assert "AMD EPYC 7B13, 2 cores" in body
    assert "load average 3.0 at start, 1.5 at end, 4.2 at most" in body


def test_no_result_no_figure(tmp_path):
    write(tmp_path, result())  # stream only: render has no result
    out = tables.render(README, tmp_path)
    body = between(out, "render")
    assert "old text" not in body
    assert "No result yet" in body and "|" not in body


def test_only_the_named_sections_are_rewritten(tmp_path, capsys):
    write(tmp_path, result())
    out = tables.render(README, tmp_path, only={"stream"})
    assert "44.8 frames/s" in between(out, "stream")
    assert between(out, "render") == between(README, "render")  # no result here: kept
    readme = tmp_path / "README.md"
    readme.write_text(README)
    args = ["--results", str(tmp_path), "--readme", str(readme)]
    assert tables.main([*args, "--only", "nothing"]) == 2
    assert "no <!-- bench:nothing --> section" in capsys.readouterr().err
    assert tables.main([*args, "--only", "stream"]) == 0
    assert readme.read_text() == out


def test_a_quick_run_is_never_shown(tmp_path):
    write(tmp_path, result(quick=True))
    body = between(tables.render(README, tmp_path), "stream")
    assert "--quick" in body and "44.8" not in body and "|" not in body


def test_text_outside_the_markers_is_kept_and_a_rerun_changes_nothing(tmp_path):
    write(tmp_path, result())
    once = tables.render(README, tmp_path)
    for kept in ("prose above, kept as it is", "between the sections, kept", "prose below"):
        assert kept in once
    assert once.startswith("# project\n")
    assert tables.render(once, tmp_path) == once


def test_main_rewrites_the_readme_and_check_sees_it_current(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(README)
    results = write(tmp_path / "results", result()).parent
    args = ["--results", str(results), "--readme", str(readme)]
    assert tables.main([*args, "--check"]) == 1  # stale: hand-typed
    assert tables.main(args) == 0
    assert "44.8 frames/s" in readme.read_text()
    assert tables.main([*args, "--check"]) == 0


def test_an_unclosed_marker_is_one_clear_error(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- bench:stream -->\nno end\n")
    assert tables.main(["--results", str(tmp_path), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "<!-- /bench:stream -->" in err


@pytest.mark.parametrize("bad", ["not json", json.dumps({"bench": "render", "figures": []})])
def test_a_damaged_or_foreign_result_names_the_file(tmp_path, bad):
    (tmp_path / "stream.json").write_text(bad)
    with pytest.raises(tables.TablesError, match="stream.json"):
        tables.render(README, tmp_path)
