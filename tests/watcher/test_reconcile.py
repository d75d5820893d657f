"""Reconcile against a real store and a real folder."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cachestore.hashcache import file_digest
from cachestore.store import open_store
from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe
from watcher.reconcile import scan, source_at
from watcher.sources import FAILED, HOT, QUEUED, load_rows, new_row, put_rows, stat_of

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

RECIPE = Recipe(max_frames=8)


def avatar_of(src, digest: str, recipe: Recipe = RECIPE) -> str:
    return plan(digest, recipe).avatar


def make_hot(store, digest: str, recipe: Recipe = RECIPE) -> str:
    """Stage manifests and an avatar manifest for the planned keys (tiny arrays)."""
    p = plan(digest, recipe)
    for name, key in p.stages.items():
        store.put_stage(key, name, {"x": np.zeros(4, np.uint8)}, {})
    store.put_avatar(p.avatar, {"stages": p.stages, "source_digest": digest, "frames": 1})
    return p.avatar


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def record(store, root: Path, rel: str, state: str, hot: bool = True) -> dict:
    src = source_at(root, rel)
    digest = file_digest(store, root / rel)
    avatar = make_hot(store, digest) if hot else avatar_of(src, digest)
    row = new_row(root, src, stat_of(root / rel), digest, avatar, state)
    put_rows(store, {rel: row})
    return row


@pytest.fixture
def store(cache):
    return open_store(cache)


def test_new_files_are_outstanding(personas, store):
    write(personas / "ruby" / "portrait.png", b"p")
    write(personas / "ruby" / "red" / "M1.mp4", b"m1")
    write(personas / "ruby" / ".red.mp4.Ab12Cd", b"rsync temp")
    write(personas / "ruby" / "notes.txt", b"no")
    found = scan(personas, store, avatar_of)
    assert sorted(o.rel for o in found.outstanding) == ["ruby/portrait.png", "ruby/red/M1.mp4"]
    assert found.hot == found.gone == found.failed == []
    loop = next(o for o in found.outstanding if o.rel.endswith("M1.mp4"))
    assert (loop.source.persona, loop.source.attire, loop.source.motion) == ("ruby", "red", "M1")


def test_hot_rows_with_their_avatar_are_left_alone(personas, store):
    write(personas / "ruby" / "portrait.png", b"p")
    record(store, personas, "ruby/portrait.png", HOT)
    found = scan(personas, store, avatar_of)
    assert found.hot == ["ruby/portrait.png"] and found.outstanding == []


def test_a_hot_row_whose_avatar_is_gone_is_outstanding(personas, store):
    write(personas / "ruby" / "portrait.png", b"p")
    record(store, personas, "ruby/portrait.png", HOT, hot=False)  # e.g. after a gc
    found = scan(personas, store, avatar_of)
    assert [o.rel for o in found.outstanding] == ["ruby/portrait.png"]


def test_changed_and_unfinished_files_are_outstanding(personas, store):
    write(personas / "ruby" / "portrait.png", b"p")
    write(personas / "ruby" / "blue.png", b"b")
    record(store, personas, "ruby/portrait.png", HOT)
    record(store, personas, "ruby/blue.png", QUEUED, hot=False)  # daemon died before it ran
    with open(personas / "ruby" / "portrait.png", "ab") as f:
        f.write(b"more")
    found = scan(personas, store, avatar_of)
    assert sorted(o.rel for o in found.outstanding) == ["ruby/blue.png", "ruby/portrait.png"]


def test_gone_and_renamed(personas, store):
    write(personas / "ruby" / "portrait.png", b"p")
    write(personas / "ruby" / "blue.png", b"b")
    record(store, personas, "ruby/portrait.png", HOT)
    row = record(store, personas, "ruby/blue.png", HOT)
    os.unlink(personas / "ruby" / "portrait.png")
    os.rename(personas / "ruby" / "blue.png", personas / "ruby" / "teal.png")
    found = scan(personas, store, avatar_of)
    assert found.gone == ["ruby/blue.png", "ruby/portrait.png"]
    assert found.moved == {"ruby/teal.png": "ruby/blue.png"}
    (teal,) = found.outstanding
    assert teal.rel == "ruby/teal.png" and teal.digest == row["digest"]


def test_failed_rows_wait_for_a_change(personas, store):
    write(personas / "ruby" / "portrait.png", b"p")
    record(store, personas, "ruby/portrait.png", FAILED, hot=False)
    assert scan(personas, store, avatar_of).failed == ["ruby/portrait.png"]
    retry = scan(personas, store, avatar_of, retry_failed=True)
    assert [o.rel for o in retry.outstanding] == ["ruby/portrait.png"]


def test_a_recipe_change_makes_hot_rows_outstanding(personas, store):
    write(personas / "ruby" / "portrait.png", b"p")
    record(store, personas, "ruby/portrait.png", HOT)
    other = Recipe(max_frames=8, bbox_shift=5)
    found = scan(personas, store, lambda src, d: avatar_of(src, d, other))
    assert [o.rel for o in found.outstanding] == ["ruby/portrait.png"]


def test_rows_of_another_folder_are_not_touched(personas, store, tmp_path):
    other = tmp_path / "other"
    write(other / "ann" / "portrait.png", b"a")
    record(store, other, "ann/portrait.png", HOT)
    assert scan(personas, store, avatar_of).gone == []
    assert list(load_rows(store, other)) == ["ann/portrait.png"]


def test_subtree_scan(personas, store):
    write(personas / "ruby" / "portrait.png", b"p")
    write(personas / "ann" / "portrait.png", b"a")
    found = scan(personas, store, avatar_of, under="ann")
    assert [o.rel for o in found.outstanding] == ["ann/portrait.png"]


def test_source_at_follows_the_catalog(personas):
    write(personas / "ruby" / "red.jpg", b"j")
    write(personas / "ruby" / "red.png", b"p")  # shadowed: the catalog takes red.jpg
    write(personas / "ruby" / "red" / "M1.mp4", b"m")
    assert source_at(personas, "ruby/red.jpg").kind == "still"
    assert source_at(personas, "ruby/red.png") is None
    assert source_at(personas, "ruby/red/M1.mp4").motion == "M1"
    assert source_at(personas, "ruby/missing.png") is None
    assert source_at(personas, "ruby/.red.png.Ab12Cd") is None
