"""The blob tier against a real nginx on loopback (`dav_methods PUT`), real LMDB stores
and the real CLI in child processes: two stores share an avatar with nothing built
twice; damaged, truncated and vanishing remotes are refused and end in a local build."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import av
import numpy as np
import pytest
import xxhash

from cachestore.gc import collect
from cachestore.keys import canonical
from cachestore.remote.pull import pull_on_miss
from cachestore.remote.push import push_avatar, wait_for_pushes
from cachestore.remote.tier import (
    ENV,
    ac_path,
    attach,
    open_remote,
    sha256,
)
from cachestore.store import forget_store, open_store
from cachestore.verify import verify
from hotplate.cli.common import invocation
from hotplate.demo_data import write_loop_video
from pipeline.catalog import plan_for
from pipeline.hot import hot_check
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from testkit.nginx import Nginx, free_port
from tests.cachestore.test_map_growth import ROOT
from tests.cachestore.tier_world import SOURCE
from tests.integrity import cli


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
        return avatar_key_open(store)
    finally:
        forget_store(cache)


def bank_key(cache) -> str:
    store = open_store(cache)
    try:
        return records_open(store)[1]
    finally:
        forget_store(cache)


def records_open(store) -> tuple[str, str]:
    """(the avatar's key, its loop's bank record's key): a loop's build makes both, in the
    avatar table (every loop is asked whether it talks; a quiet one gets an empty bank
    that says why). Exactly one of each, else the unpacking fails."""
    items = store.items("avatar")
    (avatar,) = [k for k, r in items if r.get("kind") != "bank"]
    (bank,) = [k for k, r in items if r.get("kind") == "bank"]
    return avatar, bank


def push(world, cache, tier, *args) -> subprocess.CompletedProcess:
    return cli.hotplate(world, cache, "push", "--remote", tier.url, *args)


def test_push_then_fresh_store_pulls_and_renders_the_same_frames(world, tier, monkeypatch):
    pushed = push(world, world / "built", tier)
    assert pushed.returncode == 0, pushed.stderr
    # the store's loop has its avatar and its bank record (empty: the loop is quiet), and a
    # push sends both, each with a manifest of its own, named by its key
    assert f"1 avatars on {tier.url} with 1 mouth banks" in pushed.stdout, pushed.stdout
    blobs = tier.objects("cas")
    manifests = {p.name for p in tier.objects("ac")}
    built = world / "built"
    assert blobs and manifests == {
        manifest_path(tier, avatar_key(built)).name,
        manifest_path(tier, bank_key(built)).name,
    }
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
    # nothing was built in the fresh store: no stage miss; two pulls, the avatar and its
    # loop's bank record (a render reads both, and a JIT build would have made both)
    assert seen.get("misses", 0) == 0, seen
    assert seen["pulls"] == 2 and seen["remote_hits"] == 2 and seen["bytes_pulled"] > 0, seen
    assert avatar_key(world / "fresh") == avatar_key(world / "built")
    assert bank_key(world / "fresh") == bank_key(world / "built")


def test_jit_build_pushes_in_background_and_the_next_store_pulls(world, tier, monkeypatch):
    monkeypatch.setenv(ENV, tier.url)
    first = cli.render(world, world / "one", "astro", world / "one.mp4")
    assert first.returncode == 0, first.stderr
    assert "JIT precompile" in first.stdout and "pulled" not in first.stderr
    status = json.loads(cli.hotplate(world, world / "one", "status", "--json").stdout)["remote"]
    # a JIT build makes the two records a render reads: the avatar and its loop's mouth bank
    # (every loop gets one at its build, an empty one for a loop judged not talking); each
    # is looked for on the tier first (a miss), built once and pushed
    records = 2
    assert status["url"] == tier.url and status["remote_misses"] == records, status
    assert status["pushes"] == records and status["push_failures"] == 0, status
    assert status["pulls"] == 0, status
    assert len(tier.objects("ac")) == records  # the render's process waited for its pushes
    pulled = cli.hotplate(world, world / "two", "pull")
    assert pulled.returncode == 0, pulled.stderr
    assert "1 pulled, 0 hot already, 1 mouth banks pulled" in pulled.stdout, pulled.stdout
    again = cli.hotplate(world, world / "two", "pull")
    assert "0 pulled, 1 hot already, 0 mouth banks pulled" in again.stdout, again.stdout
    # the second store renders what it pulled and builds nothing (its bank included)
    second = cli.render(world, world / "two", "astro", world / "two.mp4")
    assert second.returncode == 0 and "JIT" not in second.stdout, second.stdout
    assert counters(world, world / "two").get("misses", 0) == 0


def test_failed_push_never_fails_the_render(world, tmp_path, monkeypatch):
    readonly = Nginx(tmp_path / "ro", writable=False).start()
    try:
        monkeypatch.setenv(ENV, readonly.url)
        result = cli.render(world, world / "one", "astro", world / "one.mp4")
        assert result.returncode == 0, result.stderr
        assert (world / "one.mp4").stat().st_size > 0
        # the JIT build made the avatar and its loop's bank record, and pushed each in a
        # process of its own: each failed, one line and one count apiece
        lines = [x for x in result.stderr.splitlines() if "push of avatar" in x]
        keys = (avatar_key(world / "one"), bank_key(world / "one"))
        assert len(lines) == 2 and all(any(k[:16] in x for x in lines) for k in keys), lines
        assert all("failed" in x and readonly.url in x for x in lines), lines
        status = json.loads(cli.hotplate(world, world / "one", "status", "--json").stdout)
        assert status["remote"]["push_failures"] == 2, status["remote"]
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


def _precompile_with_tier(world, tier, cache, progress=None, source="studio.mp4"):
    """precompile() in this process, with the tier attached; returns (report, lines)."""
    attach(cache, tier.url)
    lines: list[str] = []
    source = world / "personas" / "astro" / source
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
    # the avatar's manifest, chosen by its name (the push also wrote the bank record's,
    # which this avatar-only precompile never asks for)
    manifest = manifest_path(tier, avatar_key(world / "built"))
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


def test_concurrent_push_of_one_avatar_from_two_stores(world, tier):
    store = push_from_two_stores_then_pull(world, tier.url)
    try:
        key = avatar_key_open(store)
        assert key == plan_for(store, world.joinpath(*SOURCE), Recipe()).avatar
    finally:
        close(world / "third")


def push_from_two_stores_then_pull(world, url: str):
    """Two stores holding the same avatar push it to `url` at once (real CLI processes);
    a third store pulls it: returns that store, the avatar whole in it."""
    shutil.copytree(world / "built", world / "twin")  # a second store with the same avatar
    procs = [
        subprocess.Popen(
            invocation(world / "personas", world / c, "push", "--remote", url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=world,
        )
        for c in ("built", "twin")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    pulled = cli.hotplate(world, world / "third", "pull", "--remote", url)
    # both pushed the avatar and its loop's bank record; the third pulls each once
    assert pulled.returncode == 0, pulled.stderr
    assert "1 pulled, 0 hot already, 1 mouth banks pulled" in pulled.stdout, pulled.stdout
    store = open_store(world / "third")
    for key in records_open(store):
        assert not store.damaged_stages(store.read_value("avatar", key)["stages"])
    return store


def avatar_key_open(store) -> str:
    return records_open(store)[0]


@pytest.mark.slow
def test_hotplate_serve_pulls_through_the_remote_in_hotplate_toml(world, tier):
    """The `remote` setting from hotplate.toml reaches the server's render workers."""
    from testkit.serve_helpers import Server

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
    # the avatar and its loop's bank record (a render reads both), pulled, nothing built
    assert seen["pulls"] == 2 and seen.get("misses", 0) == 0, seen


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


# -- what a pull writes, and what it checks (issue 22) -------------------------------------


def manifest_path(tier, avatar: str):
    return tier.data / ac_path("avatar", avatar)


def forge(path, change) -> None:
    """Rewrite a manifest on the tier's disk through change(body), with a valid checksum:
    what anyone who can PUT to an unsigned tier can publish."""
    outer = json.loads(path.read_bytes())
    change(outer["body"])
    outer["sha256"] = sha256(canonical(outer["body"]))
    outer.pop("hmac", None)
    path.write_bytes(json.dumps(outer).encode())


def planned(store, world, name: str = "studio.mp4"):
    return plan_for(store, world / "personas" / "astro" / name, Recipe())


def stage_bytes(store, keys) -> dict[str, bytes]:
    with store.read() as r:
        return {k: bytes(r.txn.get(k.encode(), db=store.dbs["stage"])) for k in keys}


def test_a_forged_manifest_cannot_rewrite_another_avatars_records(world, tier):
    """A manifest for avatar B that also carries records under avatar A's stage keys:
    the pulling store, which has A hot, keeps A's records byte for byte and builds B."""
    write_loop_video(world / "personas" / "astro" / "gala.mp4", n_frames=6, size=(270, 480))
    other = open_store(world / "other")
    b = precompile(world / "personas" / "astro" / "gala.mp4", Recipe(), other)
    forget_store(world / "other")
    assert push(world, world / "other", tier).returncode == 0
    victim = open_store(world / "built")
    a = planned(victim, world)
    before = stage_bytes(victim, a.stages.values())
    a_record = victim.read_value("avatar", a.avatar)

    def carry_a(body):  # B's records, filed under A's stage keys too
        for name, key in a.stages.items():
            body["stages"][key] = body["stages"][b.stages_keys[name]]

    b.stages_keys = planned(victim, world, "gala.mp4").stages
    forge(manifest_path(tier, b.avatar), carry_a)
    try:
        report, lines = _precompile_with_tier(world, tier, world / "built", source="gala.mp4")
        assert report.pulled is None and not report.hit  # refused, then built here
        (line,) = [x for x in lines if "refused" in x]
        assert "manifest" in line and "stage keys" in line, line
        assert stage_bytes(victim, a.stages.values()) == before  # A's records untouched
        assert victim.read_value("avatar", a.avatar) == a_record
        assert hot_check(victim, a.avatar)[1] == [] and verify(victim)[1] == []
    finally:
        close(world / "built")


def _no_name(body):
    del next(iter(body["stages"].values()))["name"]


def _size_64x(body):
    next(iter(body["blobs"].values()))[1] = "64x"


def _frames_text(body):
    body["record"]["frames"] = str(body["record"]["frames"])


def _fps_nan(body):
    body["record"]["fps"] = float("nan")


@pytest.mark.parametrize("forgery", [_no_name, _size_64x, _frames_text, _fps_nan])
def test_a_mistyped_manifest_field_is_one_line_never_an_exception(world, tier, forgery):
    assert push(world, world / "built", tier).returncode == 0
    store = open_store(world / "fresh")
    keys = planned(store, world)
    forge(manifest_path(tier, keys.avatar), forgery)
    attach(world / "fresh", tier.url)
    lines: list[str] = []
    try:
        assert pull_on_miss(store, keys.avatar, keys.stages, lines.append) is None
        (line,) = lines
        assert "damaged" in line and "refused" in line and "\n" not in line, line
        assert store.read_value("avatar", keys.avatar) is None
        assert store.items("stage") == []  # nothing of it entered the store
    finally:
        close(world / "fresh")


def craft_blob(shape: object) -> bytes:
    """A blob whose header says `shape` (a string where sizes belong), laid out as the
    codec lays out a real one: its hashes, computed over it, are all valid."""
    import msgpack

    header = msgpack.packb(
        {"v": 1, "dtype": "|u1", "shape": shape, "xxh3": 0, "attrs": {}}, use_bin_type=True
    )
    start = 8 + len(header)
    offset = -(-start // 64) * 64
    return b"HPA1" + len(header).to_bytes(4, "little") + header + bytes(offset - start) + b"x" * 8


def test_a_crafted_blob_header_with_valid_hashes_is_refused(world, tier):
    assert push(world, world / "built", tier).returncode == 0
    store = open_store(world / "fresh")
    keys = planned(store, world)
    crafted = craft_blob("8")
    digest, name = xxhash.xxh3_128_hexdigest(crafted), sha256(crafted)
    (tier.data / "cas" / name).write_bytes(crafted)

    def swap_in(body):  # the masks stage's first blob becomes the crafted one
        rec = body["stages"][keys.stages["masks"]]
        array = sorted(rec["blobs"])[0]
        old = rec["blobs"][array]
        rec["blobs"][array] = digest
        rec["nbytes"] += len(crafted) - body["blobs"][old][1]
        if all(old not in r["blobs"].values() for r in body["stages"].values()):
            del body["blobs"][old]
        body["blobs"][digest] = [name, len(crafted)]

    forge(manifest_path(tier, keys.avatar), swap_in)
    attach(world / "fresh", tier.url)
    lines: list[str] = []
    try:
        assert pull_on_miss(store, keys.avatar, keys.stages, lines.append) is None
        (line,) = lines
        assert name in line and "not a hotplate array" in line, line
        assert store.read_value("avatar", keys.avatar) is None
    finally:
        close(world / "fresh")


def test_a_refused_same_size_blob_is_mended_by_the_local_builds_push(world, tier):
    assert push(world, world / "built", tier).returncode == 0
    name = _damage_largest_blob(tier, "flip")  # same size: HEAD cannot tell
    try:
        report, lines = _precompile_with_tier(world, tier, world / "fresh")
        assert report.pulled is None and any(name in x and "refused" in x for x in lines)
    finally:
        close(world / "fresh")  # waits for the push that followed the local build
    blob = tier.data / "cas" / name
    assert sha256(blob.read_bytes()) == name  # uploaded again: whole
    store = open_store(world / "fresh")
    try:
        assert store.read_value("meta", "remote_mend") == []  # nothing left to mend
    finally:
        forget_store(world / "fresh")
    again, lines = _precompile_with_tier(world, tier, world / "third")
    try:
        assert again.pulled is not None, lines  # the next store pulls it, nothing refused
    finally:
        close(world / "third")


def test_gc_cannot_take_an_avatar_while_it_is_pushed(world, tier):
    """The tier hangs (SIGSTOP) once the miss has asked it and the build runs; the build
    returns with its push still waiting; gc with --max-size 1 --grace 0 runs meanwhile and
    must keep the avatar, whose push then completes once the tier answers again."""
    paused = []

    def progress(stage, done, total):
        if stage == "decode" and not paused:  # the pull has asked and missed: pause
            tier.pause()
            paused.append(True)

    try:
        report, lines = _precompile_with_tier(world, tier, world / "fresh", progress)
        assert paused and not report.hit
        store = open_store(world / "fresh")
        plan = collect(store, roots=[], grace=0, max_size=1)
        assert f"avatar:{report.avatar}" not in plan.freed, "gc took the avatar mid-push"
        assert store.get_avatar(report.avatar) is not None
    finally:
        tier.resume()
        close(world / "fresh")
    assert open_store(world / "fresh").read_value("meta", "count:pushes") == 1
    forget_store(world / "fresh")
    pulled = cli.hotplate(world, world / "third", "pull", "--remote", tier.url)
    assert pulled.returncode == 0 and "1 pulled" in pulled.stdout, pulled.stdout + pulled.stderr


# gc in a process of its own, as `hotplate gc --grace 0` with nothing rooted: it frees
# every avatar no lease holds
GC_ALL = """
import sys
from cachestore.gc import collect
from cachestore.store import open_store
print(" ".join(collect(open_store(sys.argv[1]), roots=[], grace=0, max_size=1).freed))
"""


def test_gc_cannot_take_an_avatar_while_push_avatar_uploads_it(world, tier):
    """push_avatar's own lease: gc runs once the push holds it (after the hand-over lease
    of a build's push is gone) and must leave the avatar, whose push then completes."""
    cache = world / "built"
    avatar = avatar_key(cache)
    store = open_store(cache)
    freed: list[str] = []

    def gc_now() -> None:
        done = subprocess.run(
            [sys.executable, "-c", GC_ALL, str(cache)], capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr[-2000:]
        freed.extend(done.stdout.split())

    report = push_avatar(store, open_remote(tier.url), avatar, on_leased=gc_now)
    assert f"avatar:{avatar}" not in freed, "gc took the avatar mid-push"
    assert report.sent > 0 and store.get_avatar(avatar) is not None
    forget_store(cache)
    pulled = cli.hotplate(world, world / "other", "pull", "--remote", tier.url)
    # only the avatar was pushed here, not its loop's bank record: the pull finds no bank
    # on the tier, which is no failure
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "1 pulled, 0 hot already, 0 mouth banks pulled" in pulled.stdout, pulled.stdout


def asked_for(tier) -> set[str]:
    """The ac/ objects the tier was asked for (GET), by name, as its access log says."""
    return {m[1] for m in re.finditer(r'"GET \S*/ac/([0-9a-f]{64})', "\n".join(tier.log_lines()))}


def test_a_push_outlives_its_builder_killed_with_minus_9(world, tier):
    """A render worker is killed on cancel and after stop; a CLI can be killed any time.
    The push the build started finishes all the same (it is a process of its own)."""
    import os
    import signal
    import time

    env = {**os.environ, ENV: tier.url}
    cmd = invocation(
        world / "personas", world / "fresh", "precompile", str(world.joinpath(*SOURCE))
    )
    builder = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=world, env=env)
    try:
        deadline = time.monotonic() + 300
        # both misses asked the tier: the avatar's, then (once the avatar is built) its
        # loop's bank record's. Paused after the first only, the bank's ask would time out
        # and mark the tier down in the builder, which then starts no push for the bank
        while len(asked_for(tier)) < 2:
            assert time.monotonic() < deadline and builder.poll() is None, "no pull asked"
            time.sleep(0.02)
        tier.pause()  # the bank's push (and the avatar's, if not done yet) hangs until resume
        for line in builder.stdout:  # built, and its push started
            if "now hot" in line:
                break
        else:
            raise AssertionError("the precompile ended without making the avatar hot")
        builder.send_signal(signal.SIGKILL)  # built, pushing: gone
        builder.wait(timeout=60)
    finally:
        tier.resume()
        if builder.poll() is None:
            builder.kill()
    # the build made the avatar and its loop's bank record, each with a push of its own
    # (`now hot` is printed once both are built): both pushes finish
    manifests = [
        manifest_path(tier, k) for k in (avatar_key(world / "fresh"), bank_key(world / "fresh"))
    ]
    deadline = time.monotonic() + 120
    while not all(m.exists() for m in manifests):
        assert time.monotonic() < deadline, "a push died with its builder"
        time.sleep(0.1)
    pulled = cli.hotplate(world, world / "third", "pull", "--remote", tier.url)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "1 pulled, 0 hot already, 1 mouth banks pulled" in pulled.stdout, pulled.stdout


# Pulls an avatar in a fresh process with 4 MiB batches and says how far its memory rose.
PULL_ALONE = """
import json, sys
from cachestore.remote import pull
from cachestore.remote.tier import open_remote
from cachestore.store import open_store
pull.BATCH_BYTES = 4 << 20
cache, url, avatar, stages = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
store, remote = open_store(cache), open_remote(url)
def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) starts from here
before = kib("VmRSS")
report = pull.pull_avatar(store, remote, avatar, stages)
print(json.dumps({"rise": (kib("VmHWM") - before) << 10, "bytes": report.bytes}))
"""


def test_a_pull_holds_a_batch_of_blobs_not_the_whole_avatar(world, tier):
    """64 blobs of 1 MiB pulled with 4 MiB batches: the process's memory rises by about a
    batch, not by the avatar (every download used to keep its blob until the end)."""
    store = open_store(world / "big")
    rng = np.random.default_rng(7)
    frames = {f"frame/{i:06d}": rng.integers(0, 256, 1 << 20, dtype=np.uint8) for i in range(64)}
    meta = {"frames": 64, "fps": 25.0, "width": 64, "height": 64}
    store.put_stage("big-decode", "decode", frames, meta)
    store.put_avatar("b" * 32, {"stages": {"decode": "big-decode"}, **meta})
    try:
        assert push_avatar(store, open_remote(tier.url), "b" * 32).sent == 64
    finally:
        forget_store(world / "big")
    done = subprocess.run(
        [sys.executable, "-c", PULL_ALONE, str(world / "fresh"), tier.url, "b" * 32,
         json.dumps({"decode": "big-decode"})],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    facts = json.loads(done.stdout)
    assert facts["bytes"] > 64 << 20
    # a batch and the blobs in flight (4 MiB), the client's buffers, the transaction's
    # pages: 13-19 MiB here; holding every blob, as before, rose by 91 MiB for 48
    assert facts["rise"] < 24 << 20, facts


# A talking loop's mouth bank over the tier, through `hotplate push`, `pull` and `render`:
# tests/cachestore/test_remote_banks.py.
