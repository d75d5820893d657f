"""Running the real `hotplate` CLI in a child process, for the integrity tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hotplate.cli.common import invocation


def hotplate(root: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """`hotplate --personas root/personas --cache cache ARGS`, output captured."""
    cmd = invocation(root / "personas", cache, *args)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=root)


def render(
    root: Path, cache: Path, persona: str, out: Path, *extra: str, models: Path | None = None
):
    """Render persona/studio (or the attire in extra) with root/speech.wav to out."""
    attire = [] if "--attire" in extra else ["--attire", "studio"]
    speech = ["--audio", str(root / "speech.wav")]
    first = ["--models", str(models)] if models else []
    return hotplate(
        root,
        cache,
        *first,
        "render",
        "--persona",
        persona,
        *attire,
        *speech,
        "-o",
        str(out),
        *extra,
    )
