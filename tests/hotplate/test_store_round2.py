"""The store under a studio's load, round 2 (issue 15), with real processes: gc looping
beside a cold render, a source changed between planning and snapshot, the lock moving to
the key that is built, gc roots for every installed renderer, listings while gc runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np

from cachestore.flight import building
from hotplate.demo_data import write_loop_video
from tests.hotplate.many_processes import (
    SIZE,
    as_json,
    clean_env,
    hotplate,
    make_world,
    read_line,
    render_args,
    spawn,
    start_holder,
)
from tests.hotplate.test_render_leases import wait_for

ROOT = Path(__file__).resolve().parents[2]

# gc with no pause: --max-size 1K, --grace 0 and no roots, until the stop file appears
GC_LOOP = """
import os, sys
from cachestore.gc import collect
from cachestore.store import open_store
cache, stop = sys.argv[1:3]
store = open_store(cache)
print("looping", flush=True)
runs = 0
while not os.path.exists(stop):
    collect(store, roots=set(), grace=0, max_size=1024)
    runs += 1
print(runs, flush=True)
"""


class GcLoop:
    """A real process running gc back to back on the world's store."""

    def __init__(self, world: Path) -> None:
        self.stop_file = world / f"stop-gc-{time.monotonic_ns()}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", GC_LOOP, str(world / "cache"), str(self.stop_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=world,
            env=clean_env(world),
        )
        assert read_line(self.proc.stdout, 300) == "looping"

    def stop(self) -> int:
        self.stop_file.touch()
        out, err = self.proc.communicate(timeout=300)
        assert self.proc.returncode == 0, err[-2000:]
        return int(out.split()[-1])


def frames_of(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def rendered_frames(stdout: str) -> int:
    return int(re.search(r"(\d+) frames at", stdout).group(1))


def test_gc_looping_from_the_first_instant_of_a_cold_render_never_breaks_it(tmp_path):
    """Before: the build's stages were named by no avatar until its last write, and gc
    deleted them (`KeyError: blob ... is not in the store`, or a MissingStageError)."""
    world = make_world(tmp_path, n_frames=8, seconds=1.0)
    gc = GcLoop(world)  # running before the render starts
    try:
        done = hotplate(world, *render_args(world, world / "out.mp4"))
    finally:
        runs = gc.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "JIT precompile" in done.stdout
    assert frames_of(world / "out.mp4") == rendered_frames(done.stdout) == 25
    assert runs >= 2, "the render ended before gc ran twice beside it"


def test_a_source_changed_between_planning_and_snapshot_is_leased_and_built_once(tmp_path):
    """R1 plans the old content and waits for a holder; the file changes; R2 plans the new
    content and builds it. R1 must then wait for R2's build (the lock of the key it will
    build) and render that avatar under its lease, with gc looping all along. Before:
    R1 built the new content a second time, under the old key's lock, with no lease."""
    world = make_world(tmp_path, n_frames=6, seconds=0.5)
    source = world / "personas" / "astro" / "studio.mp4"
    holder = start_holder(world)  # holds the old content's build lock, mid-decode
    gc = None
    r1 = spawn(world, *render_args(world, world / "r1.mp4"))
    try:
        assert "waiting for pid" in read_line(r1.stderr, 300)  # R1 planned the old key
        new = world / "new.mp4"
        write_loop_video(new, n_frames=6, size=SIZE, seed=7)
        os.replace(new, source)
        new_key = as_json(
            hotplate(world, "resolve", "--persona", "astro", "--attire", "studio", "--json")
        )["avatar"]
        gc = GcLoop(world)
        r2 = spawn(world, *render_args(world, world / "r2.mp4"))
        wait_for(lambda: building(world / "cache", new_key) or r2.poll() is not None, 300, "R2")
        holder.kill()  # R1 goes on: its snapshot shows the new content
        out1, err1 = r1.communicate(timeout=600)
        out2, err2 = r2.communicate(timeout=600)
    finally:
        holder.kill()
        r1.kill()
        if gc is not None:
            gc.stop()
    assert r1.returncode == 0, err1[-3000:]
    assert r2.returncode == 0, err2[-3000:]
    assert frames_of(world / "r1.mp4") == frames_of(world / "r2.mp4") == 13
    counters = as_json(hotplate(world, "status", "--json"))["counters"]
    # the holder's old avatar; R2's new avatar and the new loop's bank record (every loop's
    # build asks whether it talks, since b31260f), each built once: not by R1 as well
    assert counters["misses"] == 3, counters


def test_gc_roots_avatars_of_every_renderer_whose_weights_are_present(tmp_path):
    """An avatar built for `--backend musetalk` is a root when musetalk's weights are in
    the models dir (before: only the default renderer's recipe was rooted)."""
    from cachestore.store import open_store
    from hotplate.settings import load_settings
    from pipeline.catalog import plan_for
    from pipeline.precompile.recipe import for_backend
    from tests.pipeline.parity_fixtures import save_upstream_models

    world = make_world(tmp_path)
    models = save_upstream_models(world / "models")
    for name in ("s3fd-619a316812.pth", "dwpose/dw-ll_ucoco_384.pth"):  # hashed, not run
        (models / name).parent.mkdir(parents=True, exist_ok=True)
        (models / name).write_bytes(name.encode())
    settings = load_settings(personas=world / "personas", cache=world / "cache", models=models)
    source = world / "personas" / "astro" / "studio.mp4"
    store = open_store(world / "cache")
    kept = plan_for(store, source, for_backend(settings.recipe, "musetalk"))
    orphan = {"decode": "orphan-decode"}  # named by no source under any recipe
    for avatar, stages in ((kept.avatar, kept.stages), ("orphan-avatar", orphan)):
        for name, stage_key in stages.items():  # manifests only: gc reads no pixels
            store.put_stage(stage_key, name, {"a": np.full(64, len(avatar), np.uint8)}, {})
        store.put_avatar(avatar, {"stages": stages, "frames": 1})
    done = hotplate(world, "--models", str(models), "gc", "--grace", "0")
    assert done.returncode == 0, done.stderr
    left = {k for k, _ in open_store(world / "cache", readonly=True).items("avatar")}
    assert kept.avatar in left and len(left) == 1, done.stdout


def test_listings_read_cold_when_gc_removed_a_stage_meanwhile(tmp_path):
    """A stage gc removed under a hot avatar reads cold in ls, the catalog and the
    thumbnail. Before, a listing read the avatar and then each stage in transactions of
    their own, and a gc between them gave `None.nbytes` (a 500 over HTTP); now each reads
    one snapshot, so there is no window. The window cannot be hit on purpose from
    outside: this pins the outcome on the state it left."""
    from cachestore.store import open_store
    from hotplate.serve.catalog import list_catalog, thumbnail
    from hotplate.serve.problems import Problem
    from hotplate.settings import load_settings

    world = make_world(tmp_path)
    made = hotplate(world, "precompile", str(world / "personas" / "astro" / "studio.mp4"))
    assert made.returncode == 0, made.stderr
    store = open_store(world / "cache")
    # the loop's avatar, and its bank record beside it in the same table (empty: quiet)
    records = store.items("avatar")
    ((avatar_key, avatar),) = [(k, r) for k, r in records if r.get("kind") != "bank"]
    assert [r.get("kind") for _, r in records].count("bank") == 1, records
    assert store.delete("stage", avatar["stages"]["decode"])
    settings = load_settings(personas=world / "personas", cache=world / "cache")
    (row,) = [
        r for r in list_catalog(store, world / "personas", settings.recipe) if r["kind"] == "loop"
    ]
    assert row["state"] == "cold" and row["thumbnail"] is None
    try:
        thumbnail(store, world / "personas", settings.recipe, "astro", "studio", None)
        raise AssertionError("a thumbnail of a cold avatar")
    except Problem as exc:
        assert exc.status == 404
    listed = as_json(hotplate(world, "ls", "--json"))["sources"]
    assert {s["avatar"]: s["state"] for s in listed}[avatar_key] == "cold"
