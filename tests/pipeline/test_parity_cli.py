"""End to end: `--models` pointing straight at an upstream-layout `models/` folder (tiny
random weights), then `hotplate render --backend musetalk` from the CLI.

The detector and landmarks are overridden by their flags (dlib for both): random S3FD
weights find no face, and the DWPose port lives on another branch. Everything else is
what `--backend musetalk` implies: BiSeNet in v1.5's jaw mode from face-parse-bisent/,
v1.5 crop rules, latents and decode with sd-vae/, the v1.5 UNet and whisper/.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from testkit.render_fixtures import read_video
from tests.hotplate.test_cli_render import render_args
from tests.pipeline.parity_fixtures import save_upstream_models

SIZE = (360, 640)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    (root / "personas" / "astro").mkdir(parents=True)
    write_loop_video(root / "personas" / "astro" / "studio.mp4", n_frames=6, size=SIZE)
    write_wav(root / "speech.wav", make_speech_audio(1.0), 16000)
    save_upstream_models(root / "models")
    # resolve names every stage's model by its bytes (nothing is loaded): S3FD from the
    # torch hub cache under $TORCH_HOME, DWPose in upstream's dwpose/ folder
    hub = root / "torch" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    (hub / "s3fd-619a316812.pth").write_bytes(b"stand-in: resolve only hashes it")
    (root / "models" / "dwpose").mkdir()
    (root / "models" / "dwpose" / "dw-ll_ucoco_384.pth").write_bytes(b"stand-in")
    return root


def hotplate(world, *args):
    cmd = invocation(world / "personas", world / "cache", "--models", str(world / "models"), *args)
    repo = str(Path(__file__).resolve().parents[2])  # this checkout's code in the child
    env = {**os.environ, "HOME": str(world / "home"), "PYTHONPATH": repo}
    env["TORCH_HOME"] = str(world / "torch")
    return subprocess.run(cmd, capture_output=True, text=True, cwd=world, env=env)


def test_resolve_prints_the_recipe_musetalk_implies(world):
    result = hotplate(
        world, "resolve", "--persona", "astro", "--attire", "studio", "--backend", "musetalk"
    )
    assert result.returncode == 0, result.stderr
    assert (
        "detector s3fd, landmarks dwpose, mask bisenet (jaw), crops v1.5 (bbox_shift 0), vae sd-vae"
        in result.stdout
    )
    warp = hotplate(world, "resolve", "--persona", "astro", "--attire", "studio")
    assert "detector retinaface, landmarks facemesh, mask landmarks, crops hotplate" in warp.stdout


def test_render_musetalk_from_an_upstream_models_folder(world):
    out = world / "out.mp4"
    args = render_args(world, out, "--backend", "musetalk", "--detector", "dlib")
    args += ["--landmarks", "dlib"]
    result = hotplate(world, *args, "--device", "cpu", "--batch-size", "4")
    assert result.returncode == 0, result.stderr
    assert "JIT precompile" in result.stdout
    frames, info = read_video(out)
    assert info["video_codec"] == "h264" and info["audio_codec"] == "aac"
    assert (info["width"], info["height"]) == SIZE and abs(len(frames) - 25) <= 1
    doctor = hotplate(world, "doctor")
    assert "v1.5 (upstream json + state dict)" in doctor.stdout
    assert str(world / "models" / "whisper") in doctor.stdout
    assert "sd-vae: " in doctor.stdout
    assert str(world / "torch" / "hub" / "checkpoints" / "s3fd-619a316812.pth") in doctor.stdout
    assert str(world / "models" / "dwpose" / "dw-ll_ucoco_384.pth") in doctor.stdout
