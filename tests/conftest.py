"""Every process a test starts runs this checkout's code, and a missing precondition
skips a test here and fails it in CI.

The venv's editable install points at one checkout; a subprocess started in a temporary
folder (a server, the CLI, a worker) would import that one, not the worktree under test.
PYTHONPATH, inherited by every child, puts this checkout first.

testkit (shared with the benches) imports no pytest: it raises
`testkit.preconditions.Missing`, which the hooks below turn into a skip, or a failure
when `CI` is set (a skip in CI would hide the very failure the test is there for)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testkit.preconditions import Missing

ROOT = Path(__file__).resolve().parents[1]
_rest = os.environ.get("PYTHONPATH", "")
if not _rest.split(os.pathsep)[0] == str(ROOT):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), _rest) if p)


def missing(reason: Missing) -> None:
    """Skip for `reason`; fail under CI."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must provide it (see `just setup`)", pytrace=False)
    pytest.skip(str(reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):  # fixtures that start nginx, read the test faces, ...
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
