"""The blob tier on a real S3 server (SeaweedFS on loopback, `s3://bucket/prefix`, the
standard AWS_* variables), as test_remote.py tests it on nginx: push and pull, a damaged
object, a tier that stops answering, two stores pushing at once, signed manifests."""

from __future__ import annotations

import json
import os
import re
import subprocess

import numpy as np
import pytest

from cachestore.remote.pull import pull_on_miss
from cachestore.remote.tier import _REMOTES, TIMEOUT_ENV, ac_path, attach, sha256
from cachestore.store import forget_store, open_store
from hotplate.cli.common import invocation
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from testkit.seaweed import serving
from tests.cachestore.test_remote import (
    close,
    counters,
    frames_of,
    planned,
    push_from_two_stores_then_pull,
)
from tests.cachestore.tier_world import SOURCE
from tests.integrity import cli


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def tier(s3, world, request):
    """The S3 tier under a prefix of this test's own (no test sees another's objects)."""
    return s3.under("tier/" + re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name))


def url(tier) -> str:
    return tier.url


def push(world, cache, tier, *args, env=None):
    cmd = invocation(world / "personas", cache, "push", "--remote", url(tier), *args)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=world, env=env)


def precompile_with(world, tier, cache, key: str = "", progress=None):
    attach(cache, url(tier), key)
    lines: list[str] = []
    report = precompile(
        world.joinpath(*SOURCE),
        Recipe(),
        open_store(cache),
        on_wait=lines.append,
        progress=progress,
    )
    return report, lines


def test_push_then_a_fresh_store_pulls_from_s3_and_renders_the_same(world, tier, monkeypatch):
    pushed = push(world, world / "built", tier)
    assert pushed.returncode == 0, pushed.stderr
    # the loop's avatar and its bank record (empty: the loop is quiet), both pushed
    assert f"1 avatars on {url(tier)} with 1 mouth banks" in pushed.stdout, pushed.stdout
    monkeypatch.setenv("HOTPLATE_REMOTE", url(tier))
    fresh = cli.render(world, world / "fresh", "astro", world / "pulled.mp4")
    assert fresh.returncode == 0, fresh.stderr
    assert "pulled avatar" in fresh.stderr and url(tier) in fresh.stderr, fresh.stderr
    monkeypatch.delenv("HOTPLATE_REMOTE")
    local = cli.render(world, world / "built", "astro", world / "local.mp4")
    assert local.returncode == 0, local.stderr
    pulled, built = frames_of(world / "pulled.mp4"), frames_of(world / "local.mp4")
    assert len(pulled) == len(built) > 0
    assert all(np.array_equal(a, b) for a, b in zip(pulled, built, strict=True))
    seen = counters(world, world / "fresh")
    # nothing built: the avatar and its loop's bank record (a render reads both), pulled
    assert seen.get("misses", 0) == 0 and seen["pulls"] == 2, seen


def test_a_damaged_s3_object_is_refused_built_locally_and_mended(world, tier):
    assert push(world, world / "built", tier).returncode == 0
    store = open_store(world / "built")
    keys = planned(store, world)
    body = json.loads(tier.get(ac_path("avatar", keys.avatar)))["body"]
    forget_store(world / "built")
    name, size = max(body["blobs"].values(), key=lambda e: e[1])
    data = bytearray(tier.get(f"cas/{name}"))
    data[len(data) // 2] ^= 0x01  # same size: only the hash can tell
    tier.put(f"cas/{name}", bytes(data))
    try:
        report, lines = precompile_with(world, tier, world / "fresh")
        assert report.pulled is None and not report.hit
        (line,) = [x for x in lines if "refused" in x]
        assert name in line and "SHA-256" in line, line
    finally:
        close(world / "fresh")  # the local build's push, which mends the object
    assert sha256(tier.get(f"cas/{name}")) == name
    again, lines = precompile_with(world, tier, world / "third")
    try:
        assert again.pulled is not None, lines
    finally:
        close(world / "third")


def test_s3_that_stops_answering_mid_pull_ends_in_a_local_build(world, tier, monkeypatch):
    assert push(world, world / "built", tier).returncode == 0
    monkeypatch.setenv(TIMEOUT_ENV, "2")  # the request timeout, shortened for the test
    _REMOTES.clear()
    paused = []

    def progress(stage, done, total):
        if stage == "pull" and not paused:
            tier.pause()  # after the first verified blob: the rest find nobody answering
            paused.append(done)

    try:
        report, lines = precompile_with(world, tier, world / "fresh", progress=progress)
        tier.resume()
        assert paused, "the pull never started"
        assert report.pulled is None and not report.hit
        (line,) = [x for x in lines if "warning" in x and "push" not in x]
        assert url(tier) in line and "building locally" in line, line
        store = open_store(world / "fresh")
        assert store.get_avatar(report.avatar) is not None
        assert store.read_value("meta", "count:pulls") is None
    finally:
        tier.resume()
        close(world / "fresh")


def test_two_stores_push_one_avatar_to_s3_at_once(world, tier):
    push_from_two_stores_then_pull(world, url(tier))
    close(world / "third")


def test_signed_manifests_on_s3_pull_only_with_the_key_that_signed_them(world, tier, tmp_path):
    key_file = tmp_path / "tier.key"
    key_file.write_text("studio-secret-1\n")
    env = {**os.environ, "HOTPLATE_REMOTE_KEY": f"@{key_file}"}
    assert push(world, world / "built", tier, env=env).returncode == 0
    store = open_store(world / "fresh")
    keys = planned(store, world)
    outer = json.loads(tier.get(ac_path("avatar", keys.avatar)))
    assert len(outer["hmac"]) == 64
    forget_store(world / "fresh")

    def pull_with(cache, key: str) -> tuple[object, list[str]]:
        attach(cache, url(tier), key)
        lines: list[str] = []
        try:
            return pull_on_miss(open_store(cache), keys.avatar, keys.stages, lines.append), lines
        finally:
            forget_store(cache)

    got, lines = pull_with(world / "wrong", "another-secret")
    assert got is None and "signed with another key" in lines[0], lines
    got, lines = pull_with(world / "keyless", "")  # no key set: a signed one is whole too
    assert got is not None, lines
    got, lines = pull_with(world / "signed", f"@{key_file}")
    assert got is not None, lines

    # an unsigned manifest (pushed by a store without the key) is refused where one is set
    assert push(world, world / "built", tier).returncode == 0
    got, lines = pull_with(world / "unsigned", f"@{key_file}")
    assert got is None and "unsigned" in lines[0] and "refused" in lines[0], lines
