"""`just demo` installs what the demo runs and nothing more: the pip command its recipe
runs (read from the Justfile with `just --show`), resolved by pip itself against the
index (a dry run: nothing is installed), brings no torch, no test tools, no extra's
heavy packages."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_FOR_THE_DEMO = ("torch", "diffusers", "transformers", "ray", "aiortc", "pytest", "playwright")

pytestmark = pytest.mark.slow


def demo_install_spec() -> str:
    just = shutil.which("just") or str(Path(sys.executable).parent / "just")
    recipe = subprocess.run(
        [just, "--show", "setup-demo"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    specs = re.findall(r"pip install -q -e '([^']+)'", recipe)
    assert len(specs) == 1, recipe
    return specs[0]


def test_the_demo_installs_the_core_and_its_photo_only(tmp_path):
    spec = demo_install_spec()
    assert spec == ".[demo]"
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    cmd += ["--quiet", "--report", str(report), spec]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"hotplate", "scikit-image", "numpy", "opencv-python"} <= names
    assert not names & set(NOT_FOR_THE_DEMO), sorted(names & set(NOT_FOR_THE_DEMO))
