"""`just demo`: a sample persona from the astronaut photograph, rendered cold then hot.

Everything is made here, offline: a 1080x1920 loop with gentle motion, an attire
still, and speech (espeak-ng when installed, a synthetic speech-like signal if not).
Both renders run the real `hotplate` command in a fresh process. The demo keeps its own
folders (demo/personas, demo/cache), so it ends by printing the `ls`, `status` and `serve`
commands with the flags that show what it made.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import click

from cachestore.atomic import temp_beside
from hotplate.cli.common import invocation

DEMO = Path("demo")
SENTENCE = "Hello, I am your presenter. This video was rendered entirely offline by hotplate."


def make_persona(root: Path, frames: int) -> None:
    from hotplate.demo_data import write_loop_video, write_still

    folder = root / "astro"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "studio.mp4").exists():
        click.echo(f"making {folder / 'studio.mp4'} ({frames} frames, 1080x1920)")
        part = temp_beside(folder / "studio.mp4", suffix=".mp4")
        write_loop_video(part, n_frames=frames, motion="gentle")
        part.rename(folder / "studio.mp4")
    if not (folder / "portrait.png").exists():
        write_still(folder / "portrait.png")


def make_speech(path: Path, seconds: float) -> str:
    espeak = shutil.which("espeak-ng")
    if (
        espeak
        and subprocess.run([espeak, "-w", str(path), SENTENCE], capture_output=True).returncode == 0
    ):
        return "espeak-ng"
    from hotplate.demo_data import make_speech_audio, write_wav

    write_wav(path, make_speech_audio(seconds, sr=16000), 16000)
    return "synthetic speech-like audio"


@click.command()
@click.option("--frames", default=100, show_default=True, help="Frames in the sample loop.")
@click.option(
    "--seconds", default=6.0, show_default=True, help="Audio length when espeak-ng is missing."
)
def main(frames: int, seconds: float) -> None:
    personas, cache, out = DEMO / "personas", DEMO / "cache", DEMO / "out"
    out.mkdir(parents=True, exist_ok=True)
    make_persona(personas, frames)
    audio = out / "speech.wav"
    click.echo(f"speech: {make_speech(audio, seconds)} -> {audio}")
    base = invocation(personas, cache)
    shutil.rmtree(cache, ignore_errors=True)  # so the first render is cold
    for label, name in (
        ("cold (just-in-time precompile)", "pitch-cold.mp4"),
        ("hot (from the store)", "pitch-hot.mp4"),
    ):
        click.echo(f"\n== render {label}")
        start = time.perf_counter()
        cmd = [
            *base,
            "render",
            "--persona",
            "astro",
            "--attire",
            "studio",
            "--audio",
            str(audio),
            "-o",
            str(out / name),
        ]
        if subprocess.run(cmd).returncode:
            sys.exit(f"demo failed: {' '.join(cmd)}")
        click.echo(f"   whole command {time.perf_counter() - start:.1f} s")
    click.echo(f"\nvideo: {(out / 'pitch-hot.mp4').resolve()}")
    click.echo("\nthe demo keeps its own personas folder and store; to look at them:")
    for line in next_commands(personas, cache):
        click.echo(f"  {line}")


def next_commands(personas: Path, cache: Path) -> list[str]:
    """The README's next commands with the demo's folders, as they can be pasted here."""
    import shlex

    exe = Path(sys.executable).parent / "hotplate"
    if not exe.is_file():  # not run from the virtualenv `just setup` made
        command = f"{shlex.quote(sys.executable)} -m hotplate.cli"
    elif exe.absolute().is_relative_to(Path.cwd()):
        command = str(exe.absolute().relative_to(Path.cwd()))  # .venv/bin/hotplate
    else:
        command = shlex.quote(str(exe))
    folders = f"--personas {shlex.quote(str(personas))} --cache {shlex.quote(str(cache))}"
    base = f"{command} {folders}"
    return [
        f"{base} ls",
        f"{base} status",
        f"{base} serve      # then open http://127.0.0.1:8700/",
    ]


if __name__ == "__main__":
    main()
