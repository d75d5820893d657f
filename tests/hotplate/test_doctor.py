"""`hotplate doctor` as a new user reads it: one row per backend, and fix lines that name
one path each, the preferred one first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def doctor(tmp_path: Path, models: Path, settings: dict[str, str] | None = None) -> str:
    cmd = [sys.executable, "-m", "hotplate.cli", "--cache", str(tmp_path / "cache")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOTPLATE_")}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO), **(settings or {}))
    env.pop("TORCH_HOME", None)
    result = subprocess.run(
        [*cmd, "--models", str(models), "doctor"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    return result.stdout


def test_each_backend_has_one_row_and_its_fix_one_path_per_line(tmp_path):
    models = tmp_path / "models"
    out = doctor(tmp_path, models)
    rows = [line for line in out.splitlines() if line.startswith(("ok", "warn", "FAIL"))]
    names = [row.split(":", 1)[0].split(None, 1)[1] for row in rows]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert sum("landmarks dwpose" in n for n in names) == 1

    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("warn  mask bisenet"))
    assert "or" not in lines[at].split(" - ")[0]  # the row names the preferred file only
    assert lines[at + 1].startswith("      fix: put this file there")
    assert lines[at + 2].strip() == str(models / "79999_iter.pth")  # preferred first
    assert lines[at + 3].strip() == f"or {models / 'face-parse-bisent' / '79999_iter.pth'}"

    vae = next(i for i, line in enumerate(lines) if line.startswith("warn  vae sd-vae"))
    paths = [line.strip().removeprefix("or ") for line in lines[vae + 2 : vae + 8]]
    assert paths[0] == str(models / "sd-vae" / "config.json")  # upstream's name first
    assert all(p.startswith(str(models)) and " " not in p for p in paths)


def test_musetalk_rows_say_what_is_missing_and_the_fix_once(tmp_path):
    """The error's `missing` part is the row; its fix is the fix line (not cut from text)."""
    lines = doctor(tmp_path, tmp_path / "models").splitlines()
    for name in ("musetalk unet", "musetalk whisper", "musetalk vae"):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"warn  {name}:"))
        assert "copy" not in lines[at] and "hotplate doctor" not in lines[at], lines[at]
        assert lines[at + 1].startswith("      fix: copy upstream MuseTalk's models/ folder")


def test_a_renderer_is_ready_only_with_every_weight_of_the_recipe_it_implies(tmp_path):
    """An upstream models/ folder without DWPose's and S3FD's weights: musetalk's own
    files are there, but the recipe it implies needs those two, so it is not ready, and
    the fix names both files and the setting that picks other landmarks. With settings
    that pick landmarks and a detector this machine has, it is ready."""
    from pipeline.precompile.recipe import Recipe
    from tests.pipeline.parity_fixtures import save_upstream_models

    models = save_upstream_models(tmp_path / "models")
    lines = doctor(tmp_path, models).splitlines()
    at = next(i for i, line in enumerate(lines) if "renderer musetalk:" in line)
    assert lines[at].startswith("warn  renderer musetalk: missing"), lines[at]
    assert "dwpose/dw-ll_ucoco_384.pth (landmarks dwpose" in lines[at]
    assert "s3fd-619a316812.pth (detector s3fd" in lines[at]
    assert "79999_iter.pth" not in lines[at]  # BiSeNet's is in the folder
    fix = "\n".join(lines[at + 1 : at + 8])
    assert str(models / "dwpose" / "dw-ll_ucoco_384.pth") in fix
    default = Recipe()
    assert f"HOTPLATE_LANDMARKS={default.landmarks}" in fix
    assert f"HOTPLATE_DETECTOR={default.detector}" in fix

    chosen = {"HOTPLATE_LANDMARKS": default.landmarks, "HOTPLATE_DETECTOR": "dlib"}
    lines = doctor(tmp_path, models, chosen).splitlines()
    row = next(line for line in lines if "renderer musetalk:" in line)
    assert row.startswith("ok    renderer musetalk: ready"), row


def test_each_extra_has_a_row_with_the_command_that_adds_it(tmp_path):
    """The dev venv has every extra (`just setup`); tests/test_install.py reads the rows of
    a bare install, where they are missing."""
    from pipeline.nets.backends import EXTRAS

    lines = doctor(tmp_path, tmp_path / "models").splitlines()
    for extra in EXTRAS:
        row = next(x for x in lines if x[6:].startswith(f"extra {extra.name}:"))
        assert row.startswith(f"ok    extra {extra.name}: installed: {extra.gives}"), row
    assert {e.name for e in EXTRAS} == {"musetalk", "ray", "webrtc", "pipecat", "dev", "demo"}
    assert [e.install for e in EXTRAS][:3] == [
        "pip install 'hotplate[musetalk]'",
        "pip install 'hotplate[ray]'",
        "pip install 'hotplate[webrtc]'",
    ]


def test_each_shipped_data_set_has_a_row_naming_its_source_licence_and_replacement(tmp_path):
    """The ear and the mouth library (package data from GRID's talker s1): their rows
    name the file, the source, the licence's URI and how to replace them; the library
    warns while renders read the shipped one (a real man's mouths on other faces), and
    is ok once HOTPLATE_MOUTH_LIBRARY turns it off."""
    uri = "https://creativecommons.org/licenses/by/4.0/legalcode"
    lines = doctor(tmp_path, tmp_path / "models").splitlines()
    ear = next(line for line in lines if line.startswith(("ok    data ear:", "warn  data ear:")))
    assert ear.startswith("ok    data ear:"), ear  # the shipped file, as SOURCES.md records
    for words in ("ear.npz", "GRID talker s1", "TVR28/LipNet", uri, "python -m pipeline.mouth.ear"):
        assert words in ear, (words, ear)
    at = next(i for i, line in enumerate(lines) if "data mouth library:" in line)
    row, fix = lines[at], lines[at + 1]
    assert row.startswith("warn  data mouth library:"), row
    for words in ("mouth_library.npz", "sha256 as its SOURCES.md records", "GRID talker s1"):
        assert words in row, (words, row)
    assert "TVR28/LipNet" in row and uri in row and "likeness" in row, row
    assert fix.startswith("      fix:") and "HOTPLATE_MOUTH_LIBRARY=FILE" in fix, fix
    assert "library_build" in fix and "Whose mouths a render shows" in fix, fix

    lines = doctor(tmp_path, tmp_path / "models", {"HOTPLATE_MOUTH_LIBRARY": "off"}).splitlines()
    row = next(line for line in lines if "data mouth library:" in line)
    assert row.startswith("ok    data mouth library: off"), row
