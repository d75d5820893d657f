"""Help texts a new user reads: every option explained, defaults in one style and read
from the table that holds them (dataclass fields, Recipe, SETTINGS), never restated."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from hotplate.cli import cli

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

REPO = Path(__file__).resolve().parents[2]


def commands() -> list[tuple[str, click.Command]]:
    return [("", cli), *sorted(cli.commands.items())]


def help_of(name: str, command: click.Command) -> str:
    with click.Context(command, info_name=f"hotplate {name}".strip()) as ctx:
        return command.get_help(ctx)


@pytest.mark.parametrize(("name", "command"), commands(), ids=lambda v: str(v))
def test_every_option_has_help_and_defaults_read_one_way(name, command):
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"hotplate {name} {param.opts[0]} has no help text"
    text = " ".join(help_of(name, command).split())
    # one style, click's own: "[default: X]" (never "[default X]" or "(default: X)")
    assert not re.search(r"\[default [^:]|\(default", text), text
    assert "Show this message and exit." in text


def test_serve_port_is_explained():
    text = " ".join(help_of("serve", cli.commands["serve"]).split())
    assert re.search(r"--port INTEGER RANGE TCP port to listen on.*\[default: 8700", text)


def test_serve_and_watch_defaults_are_the_dataclasses_own():
    from hotplate.serve.config import ServeConfig
    from watcher.daemon import Config

    serve = {p.name: p for p in cli.commands["serve"].params}
    with click.Context(cli.commands["serve"]) as ctx:
        assert serve["workers"].get_default(ctx) == ServeConfig.workers
        assert serve["queue_size"].get_default(ctx) == ServeConfig.queue_size
        assert serve["max_upload_mb"].get_default(ctx) * 1e6 == ServeConfig.max_upload_bytes
        assert serve["keep_videos"].get_default(ctx) == ServeConfig.keep_videos
    watch = {p.name: p for p in cli.commands["watch"].params}
    with click.Context(cli.commands["watch"]) as ctx:
        for name in ("settle", "rescan", "workers", "retries", "backoff", "job_timeout"):
            assert watch[name].get_default(ctx) == getattr(Config, name), name
    from pipeline.render.renderers.musetalk import BATCH_SIZE

    render = {p.name: p for p in cli.commands["render"].params}
    with click.Context(cli.commands["render"]) as ctx:
        assert render["batch_size"].get_default(ctx) == BATCH_SIZE
    text = " ".join(help_of("watch", cli.commands["watch"]).split())
    assert f"[default: {Config.settle};" in text and f"[default: {Config.job_timeout};" in text


def test_the_group_help_imports_neither_the_server_nor_the_daemon():
    """Defaults are read lazily: `hotplate --help` (and resolve, ls, ...) stay fast."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from hotplate.cli import cli\n"
        "assert CliRunner().invoke(cli, ['--help']).exit_code == 0\n"
        "print(sorted(m for m in ('fastapi', 'watcher.daemon', 'torch') if sys.modules.get(m)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
