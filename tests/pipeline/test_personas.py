"""Persona resolution: every rule of the order, the error lists, and path escapes.

The resolver only looks at names, so the media files here are a few placeholder bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.personas import PersonaError, list_personas, resolve, scan_persona

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def put(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"placeholder")
    return path


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "personas"
    put(r / "ruby" / "portrait.png")
    put(r / "ruby" / "burgundy.mp4")  # attire loop, motion "default"
    put(r / "ruby" / "green.webp")  # attire still
    put(r / "ruby" / "navy.jpg")  # a still the navy loops take precedence over
    for motion in ("M2", "M10", "M1b"):  # created out of order; sorted: M10, M1b, M2
        put(r / "ruby" / "navy" / f"{motion}.mp4")
    put(r / "ruby" / "navy" / "M0.mp4.part")  # a partial upload is not a motion
    put(r / "ruby" / ".burgundy.mp4.Xa12bc")  # an rsync temp file
    put(r / "ruby" / "notes.txt")
    put(r / "omar" / "portrait.jpg")
    put(r / ".trash" / "portrait.png")
    return r


# -- the resolution order ---------------------------------------------------------------


def test_explicit_video_comes_first(root, tmp_path):
    clip = put(tmp_path / "elsewhere" / "take3.mov")
    got = resolve(root, "ruby", "navy", "M2", video=clip)
    assert (got.path, got.rule, got.motion) == (clip.resolve(), "video", "M2")
    with pytest.raises(PersonaError, match="take4.mov"):
        resolve(root, "ruby", video=tmp_path / "elsewhere" / "take4.mov")


def test_attire_loop_with_named_motion(root):
    got = resolve(root, "ruby", "navy", "M2")
    assert got.path == (root / "ruby" / "navy" / "M2.mp4").resolve()
    assert (got.persona, got.attire, got.motion, got.rule) == ("ruby", "navy", "M2", "loop")


def test_first_motion_in_sorted_order(root):
    got = resolve(root, "ruby", "navy")
    assert got.motion == sorted(["M2", "M10", "M1b"])[0] == "M10"
    assert got.path.name == "M10.mp4" and got.rule == "loop"


def test_attire_loop_video_is_motion_default(root):
    got = resolve(root, "ruby", "burgundy")
    assert (got.path.name, got.motion, got.rule) == ("burgundy.mp4", "default", "loop")
    assert resolve(root, "ruby", "burgundy", "default").path == got.path


def test_attire_still(root):
    got = resolve(root, "ruby", "green")
    assert (got.path.name, got.motion, got.rule) == ("green.webp", "default", "still")


def test_loop_beats_still_of_the_same_attire(root):
    assert resolve(root, "ruby", "navy").rule == "loop"


def test_portrait_for_attire_default(root):
    got = resolve(root, "ruby")
    assert (got.path.name, got.attire, got.rule) == ("portrait.png", "default", "portrait")
    assert resolve(root, "omar", "default").path.name == "portrait.jpg"


def test_persona_toml_options_travel_with_the_result(root):
    (root / "ruby" / "persona.toml").write_text("bbox_shift = -7\nloop = 'cycle'\n")
    assert resolve(root, "ruby", "green").options == {"bbox_shift": -7, "loop": "cycle"}
    (root / "omar" / "persona.toml").write_text("bbox_shift = = 3\n")
    with pytest.raises(PersonaError, match=r"omar/persona\.toml"):
        resolve(root, "omar")


def test_temp_hidden_and_non_media_files_are_not_attires(root):
    assert list_personas(root) == ["omar", "ruby"]
    persona = scan_persona(root, "ruby")
    assert persona.attires == ["burgundy", "default", "green", "navy"]
    assert sorted(persona.loops["navy"]) == ["M10", "M1b", "M2"]


def test_root_may_itself_be_a_symlink(root, tmp_path):
    link = tmp_path / "linked-personas"
    link.symlink_to(root)
    assert resolve(link, "ruby", "green").path == (root / "ruby" / "green.webp").resolve()


# -- errors that list what there is -------------------------------------------------------


def test_unknown_persona_lists_known_ones(root):
    with pytest.raises(PersonaError, match=r"unknown persona 'zoe'.*known: omar, ruby$"):
        resolve(root, "zoe")
    with pytest.raises(PersonaError, match="known: omar, ruby"):
        resolve(root, "Ruby")  # names are case-sensitive
    with pytest.raises(PersonaError, match="known: none"):
        resolve(root / "missing", "ruby")


def test_unknown_attire_lists_attires(root):
    with pytest.raises(
        PersonaError, match=r"no attire 'teal'; attires: burgundy, default, green, navy$"
    ):
        resolve(root, "ruby", "teal")


def test_unknown_motion_lists_motions(root):
    with pytest.raises(PersonaError, match=r"no motion 'M3'; motions: M10, M1b, M2$"):
        resolve(root, "ruby", "navy", "M3")
    with pytest.raises(PersonaError, match="is a still"):
        resolve(root, "ruby", "green", "M1")


def test_a_still_answers_to_motion_default(root):
    """The catalog lists a still with motion "default"; asking for it by that name works."""
    got = resolve(root, "ruby", "green", "default")
    assert (got.path.name, got.motion, got.rule) == ("green.webp", "default", "still")
    assert resolve(root, "ruby", motion="default").rule == "portrait"


# -- nothing outside the personas folder ------------------------------------------------------


@pytest.mark.parametrize(
    "persona, attire, motion",
    [
        ("..", "default", None),
        ("../personas", "default", None),
        ("/etc", "default", None),
        ("ruby/navy", "default", None),
        ("", "default", None),
        ("ruby", "..", None),
        ("ruby", "../omar/portrait", None),
        ("ruby", "/etc/passwd", None),
        ("ruby", "navy", ".."),
        ("ruby", "navy", "../../omar/portrait"),
        ("ruby", "navy", "/tmp/M1"),
        ("ruby", "navy", "a\\b"),
    ],
)
def test_names_that_would_escape_are_refused(root, persona, attire, motion):
    with pytest.raises(PersonaError, match="not a plain folder or file name"):
        resolve(root, persona, attire, motion)


@pytest.fixture
def outside(tmp_path) -> Path:
    o = tmp_path / "outside"
    put(o / "secret.png")
    put(o / "portrait.png")
    put(o / "M1.mp4")
    return o


def test_symlinked_file_pointing_outside_is_refused(root, outside):
    (root / "ruby" / "evil.png").symlink_to(outside / "secret.png")
    with pytest.raises(PersonaError, match="points outside the personas folder"):
        resolve(root, "ruby", "evil")
    put(root / "ruby" / "stolen" / "M0.mp4").unlink()
    (root / "ruby" / "stolen" / "M0.mp4").symlink_to(outside / "M1.mp4")
    with pytest.raises(PersonaError, match="points outside"):
        resolve(root, "ruby", "stolen", "M0")


def test_symlinked_dirs_pointing_outside_are_refused(root, outside):
    (root / "mallory").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PersonaError, match="points outside"):
        resolve(root, "mallory")
    (root / "ruby" / "away").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PersonaError, match="points outside"):
        resolve(root, "ruby", "away", "M1")


def test_symlink_that_stays_inside_is_followed(root):
    (root / "omar" / "alias.png").symlink_to(Path("..") / "ruby" / "green.webp")
    got = resolve(root, "omar", "alias")
    assert got.path == (root / "ruby" / "green.webp").resolve() and got.rule == "still"
    assert os.path.islink(root / "omar" / "alias.png")


def test_the_layout_the_watcher_and_the_decoder_agree_on_what_a_still_is(tmp_path):
    """One list of still suffixes: a .bmp (which the decoder always read as a still) is an
    attire still for the resolver, the catalog and the watcher too."""
    from pipeline.catalog import iter_sources
    from pipeline.media import is_still
    from watcher.events import judge

    still = tmp_path / "ruby" / "scan.BMP"
    still.parent.mkdir()
    still.write_bytes(b"stand-in")
    assert resolve(tmp_path, "ruby", "scan").rule == "still"
    assert [(s.attire, s.kind) for s in iter_sources(tmp_path)] == [("scan", "still")]
    assert judge("ruby/scan.BMP").kind == "still" and is_still(still)
