"""The data shipped inside hotplate is the data its SOURCES.md describes: each shipped
file's sha256 as recorded there, each source video's sha256 listed, the licence's URI
and the route the footage came by stated (issue 64). Cheap: hashes of a few hundred KB."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (ROOT / "pipeline" / "mouth" / "data", ROOT / "pipeline" / "render" / "mouth" / "data")
SHA_LINE = re.compile(r"^\s*([0-9a-f]{64})  (\S+)\s*$", re.MULTILINE)
SOURCE_LINE = re.compile(r"[0-9a-f]{64}  s1/[a-z0-9]{6}\.mpg")
URI = "https://creativecommons.org/licenses/by/4.0/legalcode"
COMMIT = "7cdd534e95aa989d9ce61c8739c64563bc496d01"


@pytest.mark.parametrize("folder", FOLDERS, ids=("ear", "mouth_library"))
def test_each_shipped_file_is_the_one_its_sources_record(folder):
    recorded = {
        name: digest for digest, name in SHA_LINE.findall((folder / "SOURCES.md").read_text())
    }
    shipped = sorted(p.name for p in folder.glob("*.npz"))
    assert shipped and set(shipped) <= set(recorded), (shipped, recorded)
    for name in shipped:
        got = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert got == recorded[name], (
            f"{folder / name}: sha256 {got}, SOURCES.md records {recorded[name]}"
        )


@pytest.mark.parametrize("folder", FOLDERS, ids=("ear", "mouth_library"))
def test_the_sources_give_the_licence_uri_the_route_and_a_note_on_likeness(folder):
    text = (folder / "SOURCES.md").read_text()
    for words in (URI, "Creators", "Copyright notice", "Disclaimer", "Modified", "TVR28/LipNet"):
        assert words in text, words
    assert COMMIT in text and "not reachable" in text and "no licence file" in text
    assert "likeness" in text.lower()


def sources_listed(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    assert lines and all(SOURCE_LINE.fullmatch(line) for line in lines), path
    names = [line.split("  ")[1].removeprefix("s1/").removesuffix(".mpg") for line in lines]
    assert len(names) == len(set(names)), path
    return names


def test_every_source_video_of_the_ear_has_its_sha256():
    """500 read, as ear.npz's own record of its training counts."""
    from pipeline.mouth import ear

    names = sources_listed(ear.WEIGHTS.with_name("ear.sources.sha256"))
    with np.load(ear.WEIGHTS) as z:
        meta = json.loads(bytes(z["meta"]).decode())
    assert len(names) == meta["train_sentences"] + meta["held_out_sentences"] == 500
    assert sum(not ear.held_out(n) for n in names) == meta["train_sentences"]


def test_every_source_video_of_the_mouth_library_has_its_sha256():
    """99 read, and every entry's sentence among them."""
    folder = FOLDERS[1]
    names = sources_listed(folder / "mouth_library.sources.sha256")
    toml = tomllib.loads((folder / "mouth_library.toml").read_text())
    assert len(names) == 99 and toml["source"]["licence_uri"] == URI
    entries = {s.split(".mpg#")[0] for s in toml["entries"]["sources"]}
    with np.load(folder / "mouth_library.npz") as z:
        assert sorted(str(s) for s in z["source"]) == sorted(toml["entries"]["sources"])
    assert entries <= set(names), sorted(entries - set(names))
