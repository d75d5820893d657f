"""Every talking loop is a bank (issue 62 item 3): a rendered (CG) loop shot while its
character speaks, with no sound, becomes a mouth bank at `hotplate precompile` and at a
render's just-in-time build alike (the two render the same frames); a loop judged not
talking says why in `resolve`, with the figure it was judged on. Not tested here, because
it is not reached: the render following the new speech at r >= 0.5 by the referee (0.155
on this shot, docs/notebook/mouth.md); the sheet of the precompiled render is written for
a person to look at.

The loop is Megamind's Roxanne (opencv-doc's Megamind.avi, CG, testkit/faces_manifest.toml:
the trailer's first shot, 97 frames at 720x528, its sound track unreadable), written as a
persona's loop with no sound. Whole processes (the CLI), a real store.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from testkit.cli_run import hotplate_alone
from testkit.mouth_fixtures import espeak, video_frames

pytestmark = pytest.mark.slow  # end to end: a CG clip, whole processes, the referee

SHOT = (1, 98)  # Roxanne's shot in Megamind.avi (frame 0 is black, 98 cuts to Hal)
WORDS = "Peter Piper picked a peck of pickled peppers. She sells sea shells by the sea shore."


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(root, frames of the CG loop, the speech): personas/roxanne/talk.mp4, the CG loop
    with no sound; personas/statue/hold.mp4, one of its frames held (a loop whose mouth
    does not move)."""
    from hotplate.demo_data import write_loop_video
    from testkit import faces

    root = tmp_path_factory.mktemp("cg_bank")
    frames = faces.clip("megamind_roxanne", SHOT[1])[0][SHOT[0] :]
    (root / "personas" / "roxanne").mkdir(parents=True)
    (root / "personas" / "statue").mkdir(parents=True)
    write_loop_video(root / "personas" / "roxanne" / "talk.mp4", frames, fps=25)
    write_loop_video(root / "personas" / "statue" / "hold.mp4", [frames[30]] * 30, fps=25)
    wav = espeak(WORDS, root / "new.wav")
    return root, frames, wav


def hotplate(root: Path, cache: str, *args: str) -> subprocess.CompletedProcess:
    return hotplate_alone(root, root / cache, *args, cwd=root, timeout=900)


def resolve(root: Path, cache: str, persona: str, attire: str) -> dict:
    args = ("resolve", "--persona", persona, "--attire", attire, "--json")
    return json.loads(hotplate(root, cache, *args).stdout)


def render(root: Path, cache: str, wav: Path, out: Path) -> subprocess.CompletedProcess:
    args = ("--persona", "roxanne", "--attire", "talk", "--audio", str(wav), "-o", str(out))
    return hotplate(root, cache, "render", *args)


def asked(root: Path, cache: str, avatar: str, wav: Path, n: int) -> np.ndarray:
    """The opening the new speech asks a render of `avatar` for (its drive)."""
    from cachestore.store import forget_store, open_store
    from pipeline.hot import load_assets
    from testkit.mouth_fixtures import asked_opening

    store = open_store(root / cache, readonly=True)
    try:
        return asked_opening(load_assets(store, avatar), wav, n)
    finally:
        forget_store(root / cache)


@pytest.fixture(scope="module")
def precompiled(world):
    """(resolve --json, the render's frames, the opening the speech asks for) after
    `hotplate precompile` of the CG loop and `hotplate render` of it with new speech."""
    root, frames, wav = world
    hotplate(root, "cache", "precompile", str(root / "personas" / "roxanne" / "talk.mp4"))
    got = resolve(root, "cache", "roxanne", "talk")
    render(root, "cache", wav, root / "precompiled.mp4")
    rendered = video_frames(root / "precompiled.mp4")
    return got, rendered, asked(root, "cache", got["avatar"], wav, len(rendered))


def test_a_cg_talking_loop_is_a_bank_at_precompile(world, precompiled, tmp_path):
    from pipeline.render.schedule import schedule
    from tests.pipeline.test_mouth_footage_bank import write_sheet

    _, frames, _ = world
    got, rendered, want = precompiled
    assert got["bank"] is not None, got  # its own bank, with every frame's mouth
    assert Path(got["bank"]["clip"]).name == "talk.mp4" and got["bank"]["entries"] == len(frames)
    # HOTPLATE_TEST_SHEETS: a folder to keep the sheet in (pytest's tmp_path goes)
    folder = Path(os.environ.get("HOTPLATE_TEST_SHEETS", tmp_path))
    under = schedule(len(rendered), len(frames), "pingpong")
    print(f"sheet: {write_sheet(folder / 'cg_bank_sheet.png', frames, rendered, under, want)}")


def test_a_render_builds_the_bank_just_in_time(world):
    root, frames, wav = world
    out = root / "jit.mp4"
    said = render(root, "jit_cache", wav, out)
    assert "JIT precompile" in said.stdout + said.stderr
    got = resolve(root, "jit_cache", "roxanne", "talk")
    assert got["bank"] is not None, got  # built with the avatar, as precompile builds it
    assert got["bank"]["entries"] == len(frames)
    if (root / "precompiled.mp4").exists():  # the render through a precompiled store's bank
        before, now = video_frames(root / "precompiled.mp4"), video_frames(out)
        assert len(before) == len(now)
        assert all(np.array_equal(a, b) for a, b in zip(before, now, strict=True))


def test_a_loop_judged_not_talking_says_why_with_its_figure(world):
    root, _, _ = world
    hotplate(root, "cache", "precompile", str(root / "personas" / "statue" / "hold.mp4"))
    got = resolve(root, "cache", "statue", "hold")
    assert got["bank"] is None and got["no_bank"], got
    assert "no sound" in got["no_bank"] and spread(got["no_bank"]) < 0.04, got["no_bank"]
    args = ("resolve", "--persona", "statue", "--attire", "hold")
    said = hotplate(root, "cache", *args).stdout.splitlines()
    line = next(s for s in said if s.startswith("bank "))
    assert line.split(None, 1)[1] == f"none: hold.mp4 judged not talking: {got['no_bank']}"
    rows = json.loads(hotplate(root, "cache", "ls", "--json").stdout)["sources"]
    (hold,) = [r for r in rows if r["persona"] == "statue"]
    assert hold["bank"]["entries"] == 0 and hold["bank"]["reason"] == got["no_bank"]


def spread(reason: str) -> float:
    """The figure a loop was judged on: 'its mouth hardly moves (openings span 0.004, ...'."""
    return float(re.search(r"openings span ([0-9.]+),", reason).group(1))
