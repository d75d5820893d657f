"""The world the blob tier tests share (nginx's and S3's): personas with one loop, speech,
and a store `built` where that loop is hot, made once per module by the real CLI; each
test gets a private copy, and no tier set in this process or its children."""

from __future__ import annotations

import shutil

import pytest

from cachestore.remote.tier import _ATTACHED, _REMOTES, ATTACHED_ENV, ENV
from cachestore.store import forget_store
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from tests.integrity import cli

SIZE = (540, 960)
SOURCE = ("personas", "astro", "studio.mp4")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """personas, speech and a store `built` where the loop is hot (the real CLI, no tier)."""
    root = tmp_path_factory.mktemp("made")
    (root / "personas" / "astro").mkdir(parents=True)
    write_loop_video(root.joinpath(*SOURCE), n_frames=8, size=SIZE)
    write_wav(root / "speech.wav", make_speech_audio(1.0), 16000)
    result = cli.hotplate(root, root / "built", "precompile", str(root.joinpath(*SOURCE)))
    assert result.returncode == 0, result.stderr
    forget_store(root / "built")
    return root


@pytest.fixture
def world(made, tmp_path, monkeypatch):
    """A private copy of `made`, and no tier set in this process or its children."""
    for name in ("personas", "built"):
        shutil.copytree(made / name, tmp_path / name)
    shutil.copy(made / "speech.wav", tmp_path)
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(ATTACHED_ENV, raising=False)
    yield tmp_path
    _ATTACHED.clear()
    _REMOTES.clear()  # a remote marked down in one test is not down in the next
