"""The fix `render --no-jit` prints: a `hotplate precompile` command line whose flags give
the very recipe the render wanted (the end-to-end paste is in test_cli_render.py)."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from hotplate.cli import RECIPE_FLAGS, cli, precompile_command
from hotplate.cli.common import invocation
from hotplate.settings import load_settings
from pipeline.catalog import recipe_for
from tests.pipeline.test_parity_recipe import upstream_files

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def test_recipe_flags_are_precompiles_recipe_options():
    names = {p.name for p in cli.commands["precompile"].params} - {"paths", "force"}
    assert names == set(RECIPE_FLAGS)


def test_the_command_carries_the_folders_and_every_field_precompile_would_miss(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    models = upstream_files(tmp_path / "models", "v1.5")
    (tmp_path / "personas" / "ruby").mkdir(parents=True)
    (tmp_path / "personas" / "ruby" / "persona.toml").write_text(
        'face = "central"\nbbox_shift = 4\n'
    )
    source = tmp_path / "personas" / "ruby" / "studio.mp4"
    source.write_bytes(b"stand-in")
    settings = load_settings(
        None, personas=tmp_path / "personas", cache=tmp_path / "cache", models=models
    )
    wanted = recipe_for(settings.personas, "ruby", settings.recipe, "musetalk", {"stride": 2})

    words = shlex.split(precompile_command(settings, source, wanted))
    assert words[:7] == [
        "hotplate",
        "--personas",
        str(tmp_path / "personas"),
        "--cache",
        str(tmp_path / "cache"),
        "--models",
        str(models),
    ]
    assert words[7:9] == ["precompile", str(source)]
    flags = dict(zip(words[9::2], words[10::2], strict=True))
    assert flags["--stride"] == "2" and flags["--vae"] == "sd-vae" and flags["--bbox-shift"] == "0"
    # the command parses, and precompile's own rule turns its flags into the same recipe
    parsed = cli.commands["precompile"].make_context("precompile", words[8:], obj=settings)
    given = {k: v for k, v in parsed.params.items() if k in RECIPE_FLAGS}
    again = recipe_for(settings.personas, "ruby", settings.recipe, flags=given)
    assert again.fields() == wanted.fields() and again.face == "central"
    assert CliRunner().invoke(cli, words[1:7] + ["precompile", "--help"]).exit_code == 0


def test_a_bbox_shift_flag_keeps_the_persona_face_hint(tmp_path):
    """`precompile --bbox-shift` used to skip persona.toml whole: its face hint was lost
    and the CLI keyed another avatar than the watcher."""
    import os
    import subprocess

    from cachestore.store import open_store
    from hotplate.demo_data import write_still

    folder = tmp_path / "personas" / "ruby"
    folder.mkdir(parents=True)
    write_still(folder / "portrait.png", size=(270, 480))
    (folder / "persona.toml").write_text('face = "central"\nbbox_shift = 4\n')
    cmd = invocation(
        tmp_path / "personas", tmp_path / "cache", "precompile", str(folder / "portrait.png")
    )
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    result = subprocess.run([*cmd, "--bbox-shift", "2"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    ((_, manifest),) = open_store(tmp_path / "cache", readonly=True).items("avatar")
    assert (manifest["recipe"]["face"], manifest["recipe"]["bbox_shift"]) == ("central", 2)
