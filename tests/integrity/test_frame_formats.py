"""A store that holds avatars in the old frame format (JPEG 4:4:4, decode stage 1) keeps
serving them after the upgrade to the I420 format (decode stage 2, new keys), until they
are rebuilt; gc, verify and push handle both. The real CLI runs in child processes on a
real store; the old avatar is made by precompile with the old codec, which writes exactly
what the code before the change wrote (same stage version, parameters and encoder)."""

from __future__ import annotations

import shutil

import av
import pytest

from cachestore.remote.pull import pull_avatar
from cachestore.remote.tier import _ATTACHED, _REMOTES, ATTACHED_ENV, ENV, open_remote
from cachestore.store import forget_store, open_store
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from pipeline import media
from pipeline.catalog import plan_for
from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from testkit.blobs import flip_one_byte
from testkit.nginx import Nginx
from tests.integrity import cli

SIZE = (540, 960)
SOURCE = ("personas", "astro", "studio.mp4")
OLD = "jpeg-q95-444"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """personas, speech, and a store `old` where the loop is hot in the old format only."""
    root = tmp_path_factory.mktemp("formats")
    (root / "personas" / "astro").mkdir(parents=True)
    write_loop_video(root.joinpath(*SOURCE), n_frames=6, size=SIZE)
    write_wav(root / "speech.wav", make_speech_audio(1.0), 16000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(media, "FRAME_CODEC", OLD)  # what precompile wrote before the change
        store = open_store(root / "old")
        precompile(root.joinpath(*SOURCE), Recipe(), store)
        forget_store(root / "old")
    return root


@pytest.fixture
def world(made, tmp_path, monkeypatch):
    for name in ("personas", "old"):
        shutil.copytree(made / name, tmp_path / name)
    shutil.copy(made / "speech.wav", tmp_path)
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(ATTACHED_ENV, raising=False)
    yield tmp_path
    _ATTACHED.clear()
    _REMOTES.clear()


def plans(root, cache):
    """(the old format's plan, the new one's) of the loop."""
    store = open_store(cache)
    try:
        digest = plan_for(store, root.joinpath(*SOURCE), Recipe()).source_digest
    finally:
        forget_store(cache)
    return plan(digest, Recipe(), frame_codec=OLD), plan(digest, Recipe())


def keys(root, cache) -> tuple[str, str]:
    """(the old format's avatar key, the new one's) of the loop."""
    old, new = plans(root, cache)
    return old.avatar, new.avatar


def avatars(cache) -> set[str]:
    """The store's avatars (not the mouth banks' records beside them)."""
    store = open_store(cache)
    try:
        return {k for k, a in store.items("avatar") if a.get("kind") != "bank"}
    finally:
        forget_store(cache)


def frame_codecs(cache) -> set[str]:
    """The format of the stored frames of every decode stage in the store."""
    store = open_store(cache)
    try:
        found = set()
        for key, record in store.items("avatar"):
            if record.get("kind") == "bank":
                continue
            decode = store.get_stage(store.get_avatar(key)["stages"]["decode"])
            with store.read() as r:
                blob = r.array(decode.blobs["frame/000000"]).copy()
            found.add("i420" if media.is_i420(blob) else "old")
        return found
    finally:
        forget_store(cache)


def render_no_jit(world, cache, name: str) -> list:
    out = world / name
    result = cli.render(world, cache, "astro", out, "--no-jit")
    assert result.returncode == 0, result.stderr
    with av.open(str(out)) as container:
        return [f for f in container.decode(video=0)]


def test_an_old_avatar_renders_hot_until_rebuilt_and_gc_keeps_it_until_then(world):
    cache = world / "old"
    old, new = keys(world, cache)
    assert old != new  # a new format is a new stage version: new keys
    assert avatars(cache) == {old} and frame_codecs(cache) == {"old"}
    # hot as it is: --no-jit renders it, and builds nothing
    assert len(render_no_jit(world, cache, "a.mp4")) == 25
    assert avatars(cache) == {old}
    assert cli.hotplate(world, cache, "verify").returncode == 0
    # gc roots the avatar renders use: the old one, while no new one exists
    result = cli.hotplate(world, cache, "gc", "--grace", "0")
    assert result.returncode == 0, result.stderr
    assert avatars(cache) == {old}
    # a precompile builds the new format; both verify
    result = cli.hotplate(world, cache, "precompile", str(world.joinpath(*SOURCE)))
    assert result.returncode == 0, result.stderr
    assert avatars(cache) == {old, new} and frame_codecs(cache) == {"old", "i420"}
    assert cli.hotplate(world, cache, "verify").returncode == 0
    # now the new one is what renders use and gc roots; the old one goes
    result = cli.hotplate(world, cache, "gc", "--grace", "0")
    assert result.returncode == 0, result.stderr
    assert avatars(cache) == {new} and frame_codecs(cache) == {"i420"}
    assert len(render_no_jit(world, cache, "b.mp4")) == 25
    assert cli.hotplate(world, cache, "verify").returncode == 0


def test_a_damaged_old_avatar_is_found_by_verify_and_rebuilt_in_the_new_format(world):
    cache = world / "old"
    old, new = keys(world, cache)
    store = open_store(cache)
    try:
        digest = store.get_stage(store.get_avatar(old)["stages"]["decode"]).blobs["frame/000003"]
        flip_one_byte(store, digest)
    finally:
        forget_store(cache)
    result = cli.hotplate(world, cache, "verify")
    assert result.returncode == 1 and "frame/000003" in result.stdout
    # a render sees it damaged, so cold: it builds the new format just in time
    out = world / "jit.mp4"
    result = cli.render(world, cache, "astro", out)
    assert result.returncode == 0, result.stderr
    assert new in avatars(cache)
    with av.open(str(out)) as container:
        assert len(list(container.decode(video=0))) == 25


def test_push_carries_both_formats_and_a_pulled_old_avatar_renders(world, tmp_path, monkeypatch):
    cache = world / "old"
    result = cli.hotplate(world, cache, "precompile", str(world.joinpath(*SOURCE)))
    assert result.returncode == 0, result.stderr
    old, new = keys(world, cache)
    server = Nginx(tmp_path / "nginx").start()
    try:
        result = cli.hotplate(world, cache, "push", "--remote", server.url)
        assert result.returncode == 0, result.stderr
        assert f"pushed {old[:16]}" in result.stdout and f"pushed {new[:16]}" in result.stdout
        # a fresh node that pulls only the old one renders it, hot
        fresh = world / "fresh"
        store = open_store(fresh)
        old_plan = plans(world, cache)[0]
        assert pull_avatar(store, open_remote(server.url), old, old_plan.stages) is not None
        forget_store(fresh)
        assert avatars(fresh) == {old}
        assert len(render_no_jit(world, fresh, "c.mp4")) == 25
        # `pull` counts it hot; a precompile (the watcher's, sync's) pulls the new format
        result = cli.hotplate(world, fresh, "pull", "--remote", server.url)
        assert result.returncode == 0 and "1 hot already" in result.stdout
        monkeypatch.setenv(ENV, server.url)
        result = cli.hotplate(world, fresh, "precompile", str(world.joinpath(*SOURCE)))
        assert result.returncode == 0, result.stderr
        assert "pulled" in result.stdout + result.stderr
        assert avatars(fresh) == {old, new} and frame_codecs(fresh) == {"old", "i420"}
    finally:
        server.stop()
