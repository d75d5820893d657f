"""The real `hotplate` CLI in a child process as a new user runs it: a HOME of its own and
none of the caller's `HOTPLATE_`/`XDG_` settings, so only the command line and the store
decide what it does (the tests of banks, stills and upgrades start it so)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hotplate.cli.common import invocation


def hotplate_alone(
    root: Path, cache: Path, *args: str, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`hotplate --personas root/personas --cache cache ARGS`, HOME at root/home, output
    captured; a non-zero exit raises AssertionError with what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTPLATE_", "XDG_"))}
    env["HOME"] = str(root / "home")
    out = subprocess.run(
        invocation(root / "personas", cache, *args),
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}: {out.stdout}{out.stderr}")
    return out
