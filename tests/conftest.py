"""Every process a test starts runs this checkout's code.

The venv's editable install points at one checkout; a subprocess started in a temporary
folder (a server, the CLI, a worker) would import that one, not the worktree under test.
PYTHONPATH, inherited by every child, puts this checkout first."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_rest = os.environ.get("PYTHONPATH", "")
if not _rest.split(os.pathsep)[0] == str(ROOT):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), _rest) if p)
