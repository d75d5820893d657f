"""A persona's talking footage as a user meets it: `hotplate sync` (the watcher's one
shot) builds speech.mp4's mouth bank, `ls` and `resolve` show it, `gc` keeps it, and the
page's catalog does not list it as an attire. Whole processes, a real store."""

from __future__ import annotations

import json
import subprocess

import pytest

from testkit import faces
from testkit.cli_run import hotplate_alone
from testkit.mouth_fixtures import espeak, talking_clip
from tests.integrity.test_damaged_blobs import damage

pytestmark = pytest.mark.slow  # end to end: a talking clip, whole processes, a real store


@pytest.fixture
def folders(tmp_path):
    import cv2

    personas, cache = tmp_path / "personas", tmp_path / "cache"
    (personas / "grace").mkdir(parents=True)
    face = faces.samples(("grace_hopper",), ("upright",))[0].image
    cv2.imwrite(str(personas / "grace" / "portrait.png"), cv2.cvtColor(face, cv2.COLOR_RGB2BGR))
    wav = espeak(
        "Peter Piper picked a peck of pickled peppers, and Bob bought a blue balloon.",
        tmp_path / "speech.wav",
    )
    talking_clip(face, wav, personas / "grace" / "speech.mp4")
    return personas, cache


def hp(folders, *args: str) -> subprocess.CompletedProcess:
    personas, cache = folders
    return hotplate_alone(personas.parent, cache, *args)


def test_sync_builds_the_bank_and_ls_resolve_and_gc_know_it(folders):
    hp(folders, "sync")
    rows = {r["attire"]: r for r in json.loads(hp(folders, "ls", "--json").stdout)["sources"]}
    assert set(rows) == {"default", "speech"}  # speech.mp4 is no attire ...
    speech = rows["speech"]
    assert speech["kind"] == "speech" and speech["state"] == "hot"
    assert speech["bank"]["state"] == "hot" and speech["bank"]["entries"] > 50
    assert rows["default"]["bank"] is None  # a still has no footage of its own
    assert "mouths" in hp(folders, "ls").stdout
    resolved = json.loads(hp(folders, "resolve", "--persona", "grace", "--json").stdout)
    assert resolved["bank"]["key"] == speech["avatar"]
    assert resolved["bank"]["entries"] == speech["bank"]["entries"]
    assert "bank" in hp(folders, "resolve", "--persona", "grace").stdout
    # ... and gc with no grace keeps the bank and the avatar
    hp(folders, "gc", "--grace", "0")
    after = {r["attire"]: r for r in json.loads(hp(folders, "ls", "--json").stdout)["sources"]}
    assert after["speech"]["bank"]["state"] == "hot"
    assert after["default"]["state"] == "hot"
    # a damaged bank is rebuilt from its clip by verify --repair, as an avatar is
    damage(folders[1], "bank", "shapes")
    repaired = hp(folders, "verify", "--repair")
    assert "rebuilt" in repaired.stdout and "0 problems" in repaired.stdout, repaired.stdout


def test_the_page_catalog_lists_no_speech_attire(folders):
    from cachestore.store import forget_store, open_store
    from hotplate.serve.catalog import list_catalog
    from pipeline.precompile.recipe import Recipe

    personas, cache = folders
    store = open_store(cache)
    try:
        rows = list_catalog(store, personas, Recipe())
    finally:
        forget_store(cache)
    assert [r["attire"] for r in rows] == ["default"]
