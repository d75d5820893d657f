"""testkit's `require` raises `Missing`; tests/conftest.py's hooks make it a skip on a
developer's machine and a failure when CI is set, in a fixture or in the test itself.

Run as the suite runs: a real pytest in a subprocess, on a folder holding this suite's
conftest.py and two tests that lack something."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import pytest

from testkit.preconditions import require


@pytest.fixture
def tool():
    require(False, "frobnicate is not installed (apt-get install frobnicate)")


def test_in_a_fixture(tool):
    pass


def test_in_the_test():
    require(None, "the widget is missing (pip install widget)")
"""


def run_probe(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    folder = tmp_path / ("ci" if ci else "dev")
    folder.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", folder / "conftest.py")
    (folder / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci:
        env["CI"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
    )


def test_missing_skips_with_its_reason_on_a_developers_machine(tmp_path):
    done = run_probe(tmp_path, ci=False)
    assert done.returncode == 0, done.stdout
    assert "2 skipped" in done.stdout
    assert "frobnicate is not installed (apt-get install frobnicate)" in done.stdout
    assert "the widget is missing (pip install widget)" in done.stdout


def test_missing_fails_in_ci(tmp_path):
    done = run_probe(tmp_path, ci=True)
    assert done.returncode == 1, done.stdout
    assert "1 failed" in done.stdout and "1 error" in done.stdout  # the fixture's: an error
    assert "frobnicate is not installed (apt-get install frobnicate); CI must provide it" in (
        done.stdout
    )
    assert "the widget is missing (pip install widget); CI must provide it" in done.stdout
