"""The blob tier against a real nginx on loopback (`dav_methods PUT`), real LMDB stores
and the real CLI in child processes: two stores share an avatar with nothing built
twice; damaged, truncated and vanishing remotes are refused and end in a local build."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import av
import numpy as np
import pytest

from cachestore.remote.pull import pull_on_miss
from cachestore.remote.push import wait_for_pushes
from cachestore.remote.tier import _ATTACHED, _REMOTES, ATTACHED_ENV, ENV, attach, open_remote
from cachestore.store import forget_store, open_store
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from pipeline.catalog import plan_for
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from tests.cachestore.nginx import Nginx, free_port
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


@pytest.fixture
def tier(tmp_path):
    server = Nginx(tmp_path / "nginx").start()
    yield server
    server.stop()


def close(cache) -> None:
    """Let this process's background pushes finish, then close the store."""
    assert wait_for_pushes()
    forget_store(cache)


def frames_of(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def counters(world, cache) -> dict:
    result = cli.hotplate(world, cache, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["counters"]


def avatar_key(cache) -> str:
    store = open_store(cache)
    try:
        (key,) = [k for k, _ in store.items("avatar")]
        return key
    finally:
        forget_store(cache)


def push(world, cache, tier, *args) -> subprocess.CompletedProcess:
    return cli.hotplate(world, cache, "push", "--remote", tier.url, *args)


def test_push_then_fresh_store_pulls_and_renders_the_same_frames(world, tier, monkeypatch):
    pushed = push(world, world / "built", tier)
    assert pushed.returncode == 0, pushed.stderr
    assert "1 avatars on" in pushed.stdout
    blobs = tier.objects("cas")
    assert blobs and len(tier.objects("ac")) == 1
    assert all(len(p.name) == 64 for p in blobs)  # SHA-256 names, as bazel-remote wants
    # a second push finds everything there and sends nothing
    again = push(world, world / "built", tier)
    assert again.returncode == 0 and "0 of" in again.stdout, again.stdout

    monkeypatch.setenv(ENV, tier.url)
    fresh = cli.render(world, world / "fresh", "astro", world / "pulled.mp4")
    assert fresh.returncode == 0, fresh.stderr
    assert "pulled avatar" in fresh.stderr and tier.url in fresh.stderr, fresh.stderr
    monkeypatch.delenv(ENV)
    local = cli.render(world, world / "built", "astro", world / "local.mp4")
    assert local.returncode == 0, local.stderr
    assert "cache hit" in local.stdout
    pulled, built = frames_of(world / "pulled.mp4"), frames_of(world / "local.mp4")
    assert len(pulled) == len(built) > 0
    assert all(np.array_equal(a, b) for a, b in zip(pulled, built, strict=True))
    seen = counters(world, world / "fresh")
    # nothing was built in the fresh store: no stage miss, one pull
    assert seen.get("misses", 0) == 0, seen
    assert seen["pulls"] == 1 and seen["remote_hits"] == 1 and seen["bytes_pulled"] > 0, seen
    assert avatar_key(world / "fresh") == avatar_key(world / "built")


def test_jit_build_pushes_in_background_and_the_next_store_pulls(world, tier, monkeypatch):
    monkeypatch.setenv(ENV, tier.url)
    first = cli.render(world, world / "one", "astro", world / "one.mp4")
    assert first.returncode == 0, first.stderr
    assert "JIT precompile" in first.stdout and "pulled" not in first.stderr
    status = json.loads(cli.hotplate(world, world / "one", "status", "--json").stdout)["remote"]
    assert status["url"] == tier.url and status["remote_misses"] == 1, status
    assert status["pushes"] == 1 and status["push_failures"] == 0 and status["pulls"] == 0, status
    assert len(tier.objects("ac")) == 1  # the render's process waited for its push at exit
    pulled = cli.hotplate(world, world / "two", "pull")
    assert pulled.returncode == 0, pulled.stderr
    assert "1 pulled, 0 hot already" in pulled.stdout, pulled.stdout
    again = cli.hotplate(world, world / "two", "pull")
    assert "0 pulled, 1 hot already" in again.stdout, again.stdout
    assert counters(world, world / "two").get("misses", 0) == 0


def test_failed_push_never_fails_the_render(world, tmp_path, monkeypatch):
    readonly = Nginx(tmp_path / "ro", writable=False).start()
    try:
        monkeypatch.setenv(ENV, readonly.url)
        result = cli.render(world, world / "one", "astro", world / "one.mp4")
        assert result.returncode == 0, result.stderr
        assert (world / "one.mp4").stat().st_size > 0
        (line,) = [x for x in result.stderr.splitlines() if "push of avatar" in x]
        assert "failed" in line and readonly.url in line, line
        status = json.loads(cli.hotplate(world, world / "one", "status", "--json").stdout)
        assert status["remote"]["push_failures"] == 1, status["remote"]
    finally:
        readonly.stop()


def _damage_largest_blob(tier, how: str) -> str:
    blob = max(tier.objects("cas"), key=lambda p: p.stat().st_size)
    data = bytearray(blob.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[: len(data) // 2]
    blob.write_bytes(bytes(data))
    return blob.name


def _precompile_with_tier(world, tier, cache, progress=None):
    """precompile() in this process, with the tier attached; returns (report, lines)."""
    attach(cache, tier.url)
    lines: list[str] = []
    source = world.joinpath(*SOURCE)
    report = precompile(
        source, Recipe(), open_store(cache), on_wait=lines.append, progress=progress
    )
    return report, lines


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_damaged_remote_blob_is_refused_and_built_locally(world, tier, how):
    assert push(world, world / "built", tier).returncode == 0
    name = _damage_largest_blob(tier, how)
    try:
        report, lines = _precompile_with_tier(world, tier, world / "fresh")
        assert report.pulled is None and not report.hit  # built here, every stage a miss
        (line,) = [x for x in lines if "refused" in x]
        assert name in line and ("truncated" if how == "truncate" else "SHA-256") in line, line
        store = open_store(world / "fresh")
        assert store.get_avatar(report.avatar) is not None
        assert not store.damaged_stages(store.read_value("avatar", report.avatar)["stages"])
        assert store.read_value("meta", "count:remote_damaged") == 1
    finally:
        close(world / "fresh")


def test_damaged_remote_manifest_is_refused(world, tier):
    assert push(world, world / "built", tier).returncode == 0
    (manifest,) = tier.objects("ac")
    manifest.write_bytes(manifest.read_bytes().replace(b'"frames"', b'"framez"', 1))
    try:
        report, lines = _precompile_with_tier(world, tier, world / "fresh")
        assert report.pulled is None and not report.hit
        assert any("manifest" in x and manifest.name in x and "refused" in x for x in lines), lines
    finally:
        close(world / "fresh")


def test_nginx_stopped_mid_pull_ends_in_a_local_build(world, tier):
    assert push(world, world / "built", tier).returncode == 0
    stopped = []

    def progress(stage, done, total):
        if stage == "pull" and not stopped:
            tier.stop()  # after the first verified blob: the rest find nobody there
            stopped.append(done)

    try:
        report, lines = _precompile_with_tier(world, tier, world / "fresh", progress)
        assert stopped, "the pull never started"
        assert report.pulled is None and not report.hit
        (line,) = [x for x in lines if "warning" in x]
        assert tier.url in line and "building locally" in line, line
        store = open_store(world / "fresh")
        assert store.get_avatar(report.avatar) is not None
        assert store.read_value("meta", "count:pulls") is None
    finally:
        close(world / "fresh")


def test_unreachable_remote_warns_once_then_builds_locally(world):
    url = f"http://127.0.0.1:{free_port()}/tier"  # nothing listens there
    lines: list[str] = []
    try:
        attach(world / "fresh", url)
        store = open_store(world / "fresh")
        source = world.joinpath(*SOURCE)
        report = precompile(source, Recipe(), store, on_wait=lines.append)
        assert not report.hit and report.pulled is None
        assert store.get_avatar(report.avatar) is not None
        # a second miss in this process does not ask the dead tier again
        assert pull_on_miss(store, "0" * 32, {}, lines.append) is None
        warnings = [x for x in lines if url in x]
        # one for the pull; the background push may add one (the tier is down for both)
        assert warnings and "unreachable" in warnings[0], lines
        assert len([x for x in warnings if "push" not in x]) == 1, lines
    finally:
        close(world / "fresh")


def test_slow_remote_times_out_warns_and_builds_locally(world, monkeypatch):
    """A tier that accepts connections and never answers: the request timeout ends the
    wait (shortened here through HOTPLATE_REMOTE_TIMEOUT), then a local build."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # take every connection, read nothing, answer nothing
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/tier"
    monkeypatch.setenv("HOTPLATE_REMOTE_TIMEOUT", "1")
    lines: list[str] = []
    try:
        attach(world / "fresh", url)
        store = open_store(world / "fresh")
        report = precompile(world.joinpath(*SOURCE), Recipe(), store, on_wait=lines.append)
        assert not report.hit and report.pulled is None
        assert store.get_avatar(report.avatar) is not None
        (line,) = [x for x in lines if url in x and "push" not in x]
        assert "building locally" in line, lines
        assert held, "the pull never reached the stalling server"
    finally:
        stop.set()
        thread.join(timeout=10)
        for conn in held:
            conn.close()
        server.close()
        close(world / "fresh")


def test_hot_render_never_asks_the_remote(world, monkeypatch):
    # the tier is a port where nothing listens: any request would print a warning
    monkeypatch.setenv(ENV, f"http://127.0.0.1:{free_port()}/tier")
    result = cli.render(world, world / "built", "astro", world / "hot.mp4")
    assert result.returncode == 0, result.stderr
    assert "cache hit" in result.stdout and "warning" not in result.stderr, result.stderr


def test_concurrent_push_of_one_avatar_from_two_stores(world, tier, monkeypatch):
    shutil.copytree(world / "built", world / "twin")  # a second store with the same avatar
    cmd = [sys.executable, "-m", "hotplate.cli", "--personas", str(world / "personas")]
    procs = [
        subprocess.Popen(
            [*cmd, "--cache", str(world / c), "push", "--remote", tier.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=world,
        )
        for c in ("built", "twin")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    pulled = cli.hotplate(world, world / "third", "pull", "--remote", tier.url)
    assert pulled.returncode == 0 and "1 pulled" in pulled.stdout, pulled.stderr
    store = open_store(world / "third")
    try:
        key = avatar_key_open(store)
        assert not store.damaged_stages(store.read_value("avatar", key)["stages"])
        assert key == plan_for(store, world.joinpath(*SOURCE), Recipe()).avatar
    finally:
        close(world / "third")


def avatar_key_open(store) -> str:
    (key,) = [k for k, _ in store.items("avatar")]
    return key


@pytest.mark.slow
def test_hotplate_serve_pulls_through_the_remote_in_hotplate_toml(world, tier):
    """The `remote` setting from hotplate.toml reaches the server's render workers."""
    from tests.hotplate.serve_helpers import Server

    assert push(world, world / "built", tier).returncode == 0
    (world / "hotplate.toml").write_text(f'remote = "{tier.url}"\n')
    server = Server(world).start()  # its store is world/cache: empty
    try:
        with server.client() as client, open(world / "speech.wav", "rb") as audio:
            response = client.post(
                "/v1/lip-sync",
                data={"persona": "astro", "attire": "studio"},
                files={"audio": ("speech.wav", audio, "audio/wav")},
            )
        assert response.status_code == 200, response.text
    finally:
        server.kill9()
    seen = counters(world, world / "cache")
    assert seen["pulls"] == 1 and seen.get("misses", 0) == 0, seen


def test_push_and_pull_by_persona(world, tier):
    pushed = push(world, world / "built", tier, "--persona", "astro")
    assert pushed.returncode == 0 and "1 avatars on" in pushed.stdout, pushed.stderr
    pulled = cli.hotplate(
        world, world / "fresh", "pull", "--remote", tier.url, "--persona", "astro"
    )
    assert pulled.returncode == 0 and "1 pulled" in pulled.stdout, pulled.stderr
    ghost = cli.hotplate(world, world / "fresh", "pull", "--remote", tier.url, "--persona", "ghost")
    assert ghost.returncode == 2 and "no files for persona ghost" in ghost.stderr, ghost.stderr
    bare = cli.hotplate(world, world / "fresh", "pull")  # no remote anywhere
    assert bare.returncode == 2 and "HOTPLATE_REMOTE" in bare.stderr, bare.stderr


def test_bad_remote_url_is_one_line(world):
    from cachestore.remote.tier import RemoteError

    with pytest.raises(RemoteError, match="set remote"):
        open_remote("nosuch://x/y")
