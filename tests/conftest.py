"""Every process a test starts runs this checkout's code (and reuses the machine's
converted networks), and a missing precondition skips a test here and fails it in CI.

The venv's editable install points at one checkout; a subprocess started in a temporary
folder (a server, the CLI, a worker) would import that one, not the worktree under test.
PYTHONPATH, inherited by every child, puts this checkout first.

testkit (shared with the benches) imports no pytest: it raises
`testkit.preconditions.Missing`, which the hooks below turn into a skip, or a failure
when `CI` is set (a skip in CI would hide the very failure the test is there for).

`pytest -m quick` (`just test-quick`) runs as a machine with only the core and the dev
extra would (tests/quick_tier.py): the other extras and the Debian tools are not there,
and a missing precondition fails a quick test. A module that imports an extra at its top
is left out of collection where that extra is not installed, and the header says so."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from pipeline.nets.cpu_speed import CACHE_ENV, cache_dir
from testkit.preconditions import Missing
from tests import quick_tier

ROOT = Path(__file__).resolve().parents[1]
_rest = os.environ.get("PYTHONPATH", "")
if not _rest.split(os.pathsep)[0] == str(ROOT):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), _rest) if p)
# and every process a test starts with a HOME of its own reuses the networks this machine
# has converted (keyed by a digest of their weights) instead of converting them again:
# an empty cache cost test_one_recipe[musetalk] ~40 s and test_parity_cli's render ~49 s
os.environ.setdefault(CACHE_ENV, str(cache_dir()))


# test modules that import an extra at their top -> the module it brings
NEED_AT_IMPORT = {"hotplate/test_pipecat.py": "pipecat", "pipeline/test_detectors.py": "torch"}
collect_ignore: list[str] = []  # pytest reads it at collection; pytest_configure fills it
QUICK = False  # `-m quick`: the quick tier, run without the extras


def pytest_configure(config: pytest.Config) -> None:
    global QUICK
    QUICK = config.option.markexpr.split()[:1] == ["quick"]
    if QUICK:
        quick_tier.go_without()
        site = str(ROOT / "tests" / "quick_site")  # and so do the processes it starts
        os.environ["PYTHONPATH"] = os.pathsep.join([site, os.environ["PYTHONPATH"]])
    for path, module in NEED_AT_IMPORT.items():
        if (QUICK or not os.environ.get("CI")) and importlib.util.find_spec(module) is None:
            collect_ignore.append(path)


# the modules that take longest (a whole run's durations, 2026-12-07), longest first.
# `just test` runs two pytest processes (pytest-xdist, --dist loadfile: a module stays on
# one, so its module-scoped servers and clips are made once), which take modules in
# collection order (--no-loadscope-reorder): started first, the long ones do not leave one
# process running alone at the end while the other idles
LONGEST_FIRST = [
    "hotplate/test_ray.py",
    "pipeline/test_mouth_still.py",
    "hotplate/test_one_recipe.py",
    "pipeline/test_mouth_bank.py",
    "hotplate/test_serve_musetalk.py",
    "pipeline/test_mouth_sync.py",
    "pipeline/test_parity_cli.py",
    "hotplate/test_serve_browser.py",
    "hotplate/test_serve_watch.py",
    "test_install.py",
    "pipeline/test_still_mouth.py",
    "pipeline/test_mouth_placement.py",
]


def _rank(item: pytest.Item) -> int:
    module = item.path.as_posix().removeprefix(f"{ROOT.as_posix()}/tests/")
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A slow test is not in the quick tier, whatever its module's mark says; the longest
    modules go first (a stable sort: each module's tests keep their order)."""
    if QUICK and (slow := [i for i in items if i.get_closest_marker("slow")]):
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if not i.get_closest_marker("slow")]
    items.sort(key=_rank)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    if QUICK:
        lines.append("quick tier: the core and [dev] only (tests/quick_tier.py)")
    if collect_ignore:
        lines.append(f"not collected, an extra they import is not installed: {collect_ignore}")
    return lines


def missing(reason: Missing) -> None:
    """Skip for `reason`; fail under CI, and in the quick tier when it is something the
    tier goes without (a quick test needs only the core and [dev])."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must provide it (see `just setup`)", pytrace=False)
    if QUICK and (without := quick_tier.gone(str(reason))):
        pytest.fail(
            f"{reason}; the quick tier goes without {without}: this test is not quick",
            pytrace=False,
        )
    pytest.skip(str(reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):  # fixtures that start nginx, read the test faces, ...
    quick_tier.hidden.clear()
    try:
        return (yield)
    except Missing as e:
        missing(e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Missing as e:
        missing(e)
