"""Leases under a gc loop, and what a build in progress keeps (issue 15, parts 2 and 4)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from cachestore.gc import collect, discard_failed
from cachestore.leases import BARRIER, LEASES, Lease, live_leases
from cachestore.store import open_store
from tests.cachestore.test_map_growth import ROOT

# Takes and releases N leases as fast as it can; every failure is counted, not raised.
LEASER = """
import json, sys
from cachestore.leases import Lease
cache, n = sys.argv[1], int(sys.argv[2])
failures = []
for i in range(n):
    try:
        with Lease(cache, [f"key-{i}"]):
            pass
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
print(json.dumps({"done": n, "failures": failures[:5], "failed": len(failures)}))
"""

# Lists (and cleans) the leases with no pause until the stop file appears.
LISTER = """
import os, sys
from cachestore.leases import live_leases
cache, stop = sys.argv[1], sys.argv[2]
print("listing", flush=True)
passes = 0
while not os.path.exists(stop):
    live_leases(cache, clean=True)
    passes += 1
print(passes)
"""


# Takes N leases, keeping each wave of WAVE live, and counts those whose file a cleaner
# unlinked while it was live (a lease gc no longer sees: its avatar is unprotected).
KEEPER = """
import json, resource, sys
from cachestore.leases import Lease
cache, n = sys.argv[1], int(sys.argv[2])
WAVE = 300
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 256)), hard))
held, lost = [], []
for i in range(n):
    held.append(Lease(cache, [f"key-{i}"]))
    if len(held) == WAVE or i == n - 1:  # checked while live, then released: the
        lost += [str(x.path) for x in held if not x.path.exists()]  # listers stay quick
        for lease in held:
            lease.release()
        held.clear()
print(json.dumps({"held": n, "lost": len(lost), "first": lost[:3]}))
"""


def leases_beside_listers(tmp_path, script: str, n: int) -> tuple[dict, list[int]]:
    """Run `script` (LEASER or KEEPER) for n leases while two processes list and clean the
    leases with no pause; returns its JSON line and the listers' passes."""
    cache, stop = tmp_path / "cache", tmp_path / "stop"
    (cache / LEASES).mkdir(parents=True)
    listers = [
        subprocess.Popen(
            [sys.executable, "-c", LISTER, str(cache), str(stop)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for lister in listers:
            assert lister.stdout.readline().strip() == "listing"
        done = subprocess.run(
            [sys.executable, "-c", script, str(cache), str(n)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )
    finally:
        stop.touch()
        passes = [int(lister.communicate(timeout=120)[0].split()[-1]) for lister in listers]
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout), passes


@pytest.mark.slow
def test_thousands_of_leases_beside_a_gc_listing_loop_never_fail(tmp_path):
    facts, passes = leases_beside_listers(tmp_path, LEASER, 4000)
    assert facts["failed"] == 0, facts
    assert min(passes) > 0
    assert not list((tmp_path / "cache" / LEASES).glob("*.lease"))  # every released one is gone


def test_no_live_lease_is_cleaned_beside_thousands_of_live_ones(tmp_path):
    """3000 leases taken and kept while two processes list and clean with no pause: a
    lease file visible for an instant before it is locked is taken for a dead holder's
    and unlinked (11 to 93 of 3000 were when lease files were created under their name
    and then locked; none since they are linked in locked)."""
    facts, passes = leases_beside_listers(tmp_path, KEEPER, 3000)
    assert facts["held"] == 3000 and min(passes) > 0
    assert facts["lost"] == 0, facts


def test_a_lease_file_is_never_visible_unlocked(tmp_path):
    """The file appears under its name already locked (O_TMPFILE, linked in): a listing
    that opens it at once sees a live holder."""
    cache = tmp_path / "cache"
    with Lease(cache, ["a"]) as lease:
        lease.extend(["b", "c"])
        infos = live_leases(cache, clean=True)
        assert sorted(k for i in infos for k in i.keys) == ["a", "b", "c"]
        temps = [p for p in (cache / LEASES).iterdir() if p.name.startswith(".")]
        assert [p.name for p in temps] == [BARRIER]  # no temp name was ever made
    assert live_leases(cache) == []


def stage(store, key: str, seed: int, kib: int = 8):
    rng = np.random.default_rng(seed)
    return store.put_stage(key, key, {"a": rng.integers(0, 255, kib << 10, np.uint8)}, {})


def test_gc_keeps_the_stages_a_build_has_leased(tmp_path):
    """A build leases its stage keys before writing: no avatar names them yet, and gc
    with --max-size 1K --grace 0 still keeps them (and their blobs)."""
    store = open_store(tmp_path / "cache")
    with Lease(store.path, ["avatar-in-progress"]) as lease:
        lease.extend(["decode-key", "track-key"])
        stage(store, "decode-key", 1)
        stage(store, "unleased", 2)
        plan = collect(store, roots=set(), grace=0, max_size=1024, now=time.time() + 10)
        assert plan.stages == ["unleased"]
        assert store.load_arrays("decode-key") is not None
    plan = collect(store, roots=set(), grace=0, now=time.time() + 10)
    assert plan.stages == ["decode-key"]  # released: an ordinary orphan again


def test_a_failed_builds_rollback_spares_stages_another_build_leased(tmp_path):
    """Two recipes share the decode stage; the build of one fails: its rollback must not
    delete the decode stage the other build has leased (and is reading)."""
    store = open_store(tmp_path / "cache")
    with Lease(store.path, ["avatar-b", "shared-decode", "b-track"]) as other:
        mine = Lease(store.path, ["avatar-a", "shared-decode", "a-track"])
        try:
            stage(store, "shared-decode", 1)
            stage(store, "a-track", 2)
            assert discard_failed(store, ["shared-decode", "a-track"], mine) == 1
        finally:
            mine.release()
        assert store.get_stage("shared-decode") is not None
        assert store.get_stage("a-track") is None
        assert other.keys  # still live
    assert discard_failed(store, ["shared-decode"], None) == 1


def test_bf16_latents_get_keys_of_their_own(monkeypatch, tmp_path):
    from pipeline.precompile.plan import plan
    from pipeline.precompile.recipe import Recipe
    from testkit.render_fixtures import tiny_sd_vae

    tiny_sd_vae().save_pretrained(tmp_path / "models" / "sd-vae-ft-mse")
    recipe = Recipe(vae="sd-vae-ft-mse", models_dir=tmp_path / "models")
    monkeypatch.delenv("HOTPLATE_CPU_RUNTIME", raising=False)
    float32 = plan("d" * 32, recipe)
    monkeypatch.setenv("HOTPLATE_CPU_RUNTIME", "onnxruntime")  # float32 too: same keys
    assert plan("d" * 32, recipe) == float32
    monkeypatch.setenv("HOTPLATE_CPU_RUNTIME", "bf16")
    bf16 = plan("d" * 32, recipe)
    assert bf16.stages["latents"] != float32.stages["latents"]
    assert bf16.stages["decode"] == float32.stages["decode"]  # no network there
    assert bf16.avatar != float32.avatar
