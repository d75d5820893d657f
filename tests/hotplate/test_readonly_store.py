"""A store the user can only read, as an unprivileged user (CI runs as root, so the
commands run as `nobody` through setpriv): hot renders work, and precompile and gc say
in one line that they cannot write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import av
import pytest

from testkit.preconditions import require
from tests.hotplate.many_processes import (
    ROOT,
    clean_env,
    cli_args,
    hotplate,
    make_world,
    render_args,
)

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def nobody_can_run(python: str, env: dict[str, str]) -> bool:
    probe = [*AS_NOBODY, python, "-c", "import lmdb, numpy, av, hotplate.cli"]
    return subprocess.run(probe, env=env, capture_output=True, cwd="/").returncode == 0


def grant_search(paths: list[Path]) -> dict[Path, int]:
    """Let others traverse (o+x, not read) every ancestor of paths that forbids it, e.g.
    a 0700 `mktemp -d` that holds the checkout; returns the modes to restore."""
    changed = {}
    for path in paths:
        for folder in [path, *path.parents]:
            mode = folder.stat().st_mode
            if folder.is_dir() and not mode & 0o001 and folder not in changed:
                changed[folder] = mode & 0o7777
                folder.chmod(changed[folder] | 0o001)
    return changed


@pytest.fixture(scope="module")
def nobody():
    """(python, env) that run this worktree's hotplate as nobody, or a skip saying why."""
    require(
        os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to run as nobody"
    )
    # The venv's interpreter may live where nobody cannot go (e.g. under /root); then use
    # a system Python of the same version with the venv's packages on the path.
    env = clean_env(Path("/tmp"))
    purelib = Path(sysconfig.get_paths()["purelib"])
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{purelib}"
    changed = grant_search([Path(ROOT).resolve(), purelib.resolve()])
    try:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        for python in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
            if Path(python).exists() and nobody_can_run(python, env):
                yield python, env
                return
        require(False, f"nobody cannot run a {version} that imports {ROOT} and the venv's packages")
    finally:
        for folder, mode in changed.items():
            folder.chmod(mode)


@pytest.fixture(scope="module")
def world():
    """A hot store made by root in a folder everyone may read; out/ everyone may write."""
    root = Path(tempfile.mkdtemp(prefix="hotplate-readonly-", dir="/tmp"))
    root.chmod(0o755)
    make_world(root)
    made = hotplate(root, "precompile", str(root / "personas" / "astro" / "studio.mp4"))
    assert made.returncode == 0, made.stderr
    (root / "out").mkdir(mode=0o777)
    (root / "out").chmod(0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def as_nobody(nobody, world: Path, *args: str) -> subprocess.CompletedProcess:
    python, env = nobody
    cmd = [*AS_NOBODY, python, *cli_args(world, *args)[1:]]
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=world, env={**env, "HOME": str(world / "out")}
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_hot_render_works_from_a_store_nobody_can_write(nobody, world):
    data = world / "cache" / "data.mdb"
    before = (data.stat().st_mtime_ns, data.stat().st_size)
    out = world / "out" / "hot.mp4"
    result = as_nobody(nobody, world, *render_args(world, out))
    assert result.returncode == 0, result.stderr
    assert "cache hit" in result.stdout
    with av.open(str(out)) as c:
        assert sum(1 for _ in c.decode(video=0)) > 0
    assert (data.stat().st_mtime_ns, data.stat().st_size) == before  # nothing was written
    assert not any((world / "cache" / "leases").glob("*.lease"))


def test_precompile_and_gc_say_in_one_line_that_they_cannot_write(nobody, world):
    video = str(world / "personas" / "astro" / "studio.mp4")
    for args in (("precompile", "--force", video), ("gc", "--max-size", "1")):
        line = one_error_line(as_nobody(nobody, world, *args))
        assert "not writable" in line and str(world / "cache") in line, line


def test_status_ls_and_verify_read_it(nobody, world):
    for args in (("status", "--json"), ("ls", "--json"), ("verify", "--json")):
        result = as_nobody(nobody, world, *args)
        assert result.returncode == 0, result.stderr
    assert '"state": "hot"' in as_nobody(nobody, world, "ls", "--json").stdout
