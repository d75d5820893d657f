"""`just demo` ends with the commands that show what it made, and they work when pasted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_demo_prints_ls_status_and_serve_with_its_own_folders(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home")}
    env.pop("HOTPLATE_CONFIG", None)
    demo = subprocess.run(
        [sys.executable, "-m", "hotplate.demo", "--frames", "4", "--seconds", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert demo.returncode == 0, demo.stderr
    printed = [line.strip() for line in demo.stdout.splitlines() if " --personas " in line]
    commands = {line.split("#")[0].split()[-1]: line.split("#")[0].strip() for line in printed}
    assert set(commands) == {"ls", "status", "serve"}
    for command in commands.values():
        assert "--personas demo/personas --cache demo/cache" in command

    ls = subprocess.run(
        commands["ls"], shell=True, capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert ls.returncode == 0, ls.stderr
    studio = next(line for line in ls.stdout.splitlines() if "studio" in line)
    assert "astro" in studio and "hot" in studio
    status = subprocess.run(
        commands["status"], shell=True, capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert status.returncode == 0 and str(Path("demo") / "cache") in status.stdout, status.stdout
