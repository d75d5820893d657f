"""The same request through every front end gives the same avatar key.

One persona (a loop and a persona.toml with a face hint and a bbox_shift), one set of
settings (HOTPLATE_*), and for each backend (warp; musetalk on an upstream-layout models
folder) the request goes through `hotplate render`, `lip_sync` in this process, `POST
/v1/lip-sync` on a real server and the watcher (`hotplate sync`), each into a store of
its own. Each front end builds the avatar; the four stores must hold the same one avatar
and the same one mouth bank record, and `hotplate resolve` must name the avatar.

Detector and landmarks are dlib's (settings): random S3FD weights find no face. musetalk
implies the rest (BiSeNet, v1.5 crops, sd-vae/ latents).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from testkit.serve_helpers import Server, post_render
from tests.pipeline.parity_fixtures import save_upstream_models

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SIZE = (270, 480)
SETTINGS = {"HOTPLATE_DETECTOR": "dlib", "HOTPLATE_LANDMARKS": "dlib"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-recipe")
    folder = root / "personas" / "astro"
    folder.mkdir(parents=True)
    write_loop_video(folder / "studio.mp4", n_frames=4, size=SIZE)
    (folder / "persona.toml").write_text('face = "central"\nbbox_shift = 3\n')
    write_wav(root / "speech.wav", make_speech_audio(0.5), 16000)
    save_upstream_models(root / "models")
    return root


def env_of(world: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        **SETTINGS,
        "HOTPLATE_MODELS": str(world / "models"),
        "HOME": str(world / "home"),
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def hotplate(world: Path, cache: Path, *args: str, **env: str) -> str:
    result = subprocess.run(
        invocation(world / "personas", cache, *args),
        capture_output=True,
        text=True,
        cwd=world,
        env=env_of(world, **env),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def records(cache: Path, kind: str) -> set[str]:
    """The keys of the store's avatar records of one kind: "avatar" (a loop's or a still's
    stages) or "bank" (the mouth bank every loop is asked for, in the same table)."""
    from cachestore.store import open_store

    items = open_store(cache, readonly=True).items("avatar")
    return {key for key, rec in items if (rec.get("kind") == "bank") == (kind == "bank")}


def avatars(cache: Path) -> set[str]:
    return records(cache, "avatar")


def through_lip_sync(world: Path, cache: Path, backend: str, monkeypatch) -> None:
    from cachestore.store import open_store
    from hotplate.settings import load_settings
    from pipeline.lip_sync import LipSyncRequest, lip_sync

    for name, value in env_of(world).items():
        if name.startswith("HOTPLATE_"):
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("HOTPLATE_RENDERER", raising=False)
    settings = load_settings(None, personas=world / "personas", cache=cache)
    request = LipSyncRequest(
        persona="astro",
        attire="studio",
        audio=world / "speech.wav",
        output=cache.parent / f"lip-sync-{backend}.mp4",
        backend=backend,
        device="cpu",
    )
    store = open_store(cache)  # the process's one handle: not closed (see open_store)
    lip_sync(store, settings.personas, settings.recipe, request)


@pytest.mark.parametrize("backend", ["warp", "musetalk"])
def test_every_front_end_gives_the_same_avatar_key(world, backend, tmp_path, monkeypatch):
    caches = {name: tmp_path / name for name in ("cli", "lip_sync", "http", "watcher")}
    # 1. the CLI
    out = tmp_path / "cli.mp4"
    hotplate(
        world,
        caches["cli"],
        "render",
        "--persona",
        "astro",
        "--attire",
        "studio",
        "--audio",
        str(world / "speech.wav"),
        "-o",
        str(out),
        "--backend",
        backend,
        "--device",
        "cpu",
    )
    # 2. lip_sync, as the front ends call it
    through_lip_sync(world, caches["lip_sync"], backend, monkeypatch)
    # 3. the HTTP route
    server_env = {**SETTINGS, "HOTPLATE_MODELS": str(world / "models")}
    http_root = tmp_path / "http-root"  # Server serves <root>/personas into <root>/cache
    http_root.mkdir()
    os.symlink(world / "personas", http_root / "personas")
    with Server(http_root, "--workers", "1", env=server_env) as srv, srv.client() as client:
        response = post_render(client, "/v1/lip-sync", world / "speech.wav", backend=backend)
        assert response.status_code == 200, response.text
    caches["http"] = http_root / "cache"
    # 4. the watcher, whose backend is the settings' renderer
    hotplate(world, caches["watcher"], "sync", HOTPLATE_RENDERER=backend)

    keys = {name: avatars(cache) for name, cache in caches.items()}
    assert all(len(k) == 1 for k in keys.values()), keys
    assert len(set.union(*keys.values())) == 1, keys
    # and the same bank record: the loop was asked once whether it talks, on every path
    banks = {name: records(cache, "bank") for name, cache in caches.items()}
    assert all(len(b) == 1 for b in banks.values()) and len(set.union(*banks.values())) == 1, banks
    (key,) = keys["cli"]
    resolved = hotplate(
        world,
        caches["cli"],
        "resolve",
        "--persona",
        "astro",
        "--attire",
        "studio",
        "--backend",
        backend,
    )
    assert key in resolved, resolved
