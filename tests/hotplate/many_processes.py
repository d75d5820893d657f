"""Helpers for tests where several real hotplate processes share one store.

Every child gets a clean environment (no HOTPLATE_* or XDG_* variables, HOME in the
test's folder), so a developer's settings never leak in; children import this
worktree's code first (PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav

ROOT = Path(__file__).resolve().parents[2]
SIZE = (540, 960)

# Holds the avatar's build lock from inside a real precompile: at the first decoded
# frame it says so on stdout and blocks on stdin, until it is killed.
HOLDER = """
import sys
from pathlib import Path
from cachestore.store import open_store
from hotplate.settings import load_settings
from pipeline.precompile.run import precompile

personas, cache, source = sys.argv[1:4]
def progress(stage, done, total):
    if stage == "decode" and done == 1:
        print("holding", flush=True)
        sys.stdin.read()
recipe = load_settings(None, personas=personas, cache=cache).recipe
precompile(Path(source), recipe, open_store(cache), progress=progress)
"""


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTPLATE_", "XDG_"))}
    env.update(HOME=str(home), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return env


def make_world(root: Path, n_frames: int = 6, seconds: float = 0.5) -> Path:
    """personas/astro/studio.mp4 (a 540x960 loop) and speech.wav under root."""
    (root / "personas" / "astro").mkdir(parents=True, exist_ok=True)
    write_loop_video(root / "personas" / "astro" / "studio.mp4", n_frames=n_frames, size=SIZE)
    write_wav(root / "speech.wav", make_speech_audio(seconds), 16000)
    return root


def cli_args(world: Path, *args: str) -> list[str]:
    return invocation(world / "personas", world / "cache", *args)


def hotplate(
    world: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run `hotplate ARGS` on the world's personas and cache; env adds variables."""
    return subprocess.run(
        cli_args(world, *args),
        capture_output=True,
        text=True,
        cwd=world,
        env={**clean_env(world), **(env or {})},
        timeout=timeout,
    )


def spawn(world: Path, *args: str, stdin: int | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        cli_args(world, *args),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=world,
        env=clean_env(world),
    )


def render_args(world: Path, out: Path, audio: str = "speech.wav") -> list[str]:
    return [
        "render",
        "--persona",
        "astro",
        "--attire",
        "studio",
        "--audio",
        str(world / audio),
        "-o",
        str(out),
    ]


def start_holder(world: Path, attire: str = "studio") -> subprocess.Popen:
    """A real precompile of an attire's loop that holds its lock until killed."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(world / "personas"),
            str(world / "cache"),
            str(world / "personas" / "astro" / f"{attire}.mp4"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=world,
        env=clean_env(world),
    )
    assert read_line(proc.stdout, 300) == "holding", "the holder never reached its first frame"
    return proc


def read_line(stream, timeout: float) -> str:
    """The next line of a child's pipe, waiting at most timeout seconds."""
    got: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: got.put(stream.readline()), daemon=True).start()
    try:
        return got.get(timeout=timeout).strip()
    except queue.Empty:
        raise AssertionError(f"no line from the child within {timeout} s") from None


def as_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
