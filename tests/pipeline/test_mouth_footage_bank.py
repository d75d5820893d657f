"""Any footage is a bank: a loop shot while the presenter spoke, with no sound, is a bank of
its own mouths, and a render of it with new speech replaces every frame's mouth with the
one the speech asks for, so the loop's own words are gone.

The loop is real talking footage (testkit/footage/: HDTF's katie_hill, 4 s, 512x512, not
GRID's talker, whom the ear is trained on) with its sound stripped, put in a personas
folder and precompiled as the watcher does it (avatar and bank). It is rendered speaking
new words (espeak-ng). The independent referee (dlib, testkit/referee.py) judges the
render: its lip gap follows the opening the new speech asks for (the renderer's drive,
`asked_opening`) and not the loop's own lip gap under it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cachestore.store import forget_store, open_store
from hotplate.demo_data import write_loop_video
from pipeline.catalog import bank_info, bank_plan
from pipeline.hot import load_assets, load_bank
from pipeline.lip_sync import LipSyncRequest, lip_sync
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile_source
from pipeline.render.schedule import schedule
from testkit.mouth_fixtures import (
    asked_opening,
    correlation,
    espeak,
    referee_gaps,
    video_frames,
)

pytestmark = pytest.mark.slow  # end to end: a real clip, a precompile, a render, the referee

CLIP = "katie_hill"
FRAMES = 100  # 4 s at 25 fps
FOLLOWS = 0.5  # r of the referee's gap against the opening the new speech asks for
OWN_WORDS = 0.3  # |r| of the referee's gap against the loop's own gap under each frame
NEW_WORDS = (
    "Peter Piper picked a peck of pickled peppers. How much wood would a woodchuck chuck. "
    "She sells sea shells by the sea shore."
)


@pytest.fixture(scope="module")
def silent_loop(tmp_path_factory):
    """(personas root, store, loop path, the clip's frames) with the loop's avatar and
    bank hot, as `hotplate sync` leaves them."""
    from testkit import footage

    tmp = tmp_path_factory.mktemp("footage_bank")
    clip = footage.load(CLIP)
    frames = list(clip.frames[:FRAMES])
    (tmp / "personas" / "kate").mkdir(parents=True)
    loop = write_loop_video(tmp / "personas" / "kate" / "talk.mp4", frames, fps=clip.fps)
    store = open_store(tmp / "store")
    precompile_source(loop, Recipe(), store)
    yield tmp / "personas", store, loop, frames
    forget_store(tmp / "store")


def test_a_loop_with_no_sound_is_a_bank_of_its_own_mouths(silent_loop):
    import av

    _, store, loop, _ = silent_loop
    with av.open(str(loop)) as container:
        assert not container.streams.audio  # shot while speaking, no sound
    info = bank_info(store, bank_plan(store, loop, Recipe(), "loop").avatar)
    assert info is not None and info["entries"] == FRAMES, info
    bank = load_bank(store, info["key"])
    assert not bank.has_model  # no sound to fit a model on: the drive asks for shapes
    assert np.ptp(bank.shapes[:, 0]) > 0.1  # the presenter's mouths, open and closed


def test_the_loop_rendered_with_new_speech_says_it_not_its_own_words(silent_loop, tmp_path):
    root, store, loop, frames = silent_loop
    wav = espeak(NEW_WORDS, tmp_path / "new.wav")
    out = tmp_path / "out.mp4"
    outcome = lip_sync(store, root, Recipe(), LipSyncRequest("kate", "talk", wav, out))
    assert outcome.bank == bank_plan(store, loop, Recipe(), "loop").avatar  # its own bank
    rendered = video_frames(out)
    n = len(rendered)
    assets = load_assets(store, outcome.avatar)
    gaps = referee_gaps(rendered, 2)
    asked = asked_opening(assets, wav, n)
    under = schedule(n, len(frames), "pingpong")  # the stored frame under each output frame
    own = referee_gaps(frames)[under]
    r_new, r_own = correlation(asked[::2], gaps), correlation(own[::2], gaps)
    print(
        f"{CLIP} loop, {len(frames)} frames, no sound: r = {r_new:.3f} against the new "
        f"speech, {r_own:.3f} against its own words"
    )
    # HOTPLATE_TEST_SHEETS: a folder to keep the sheet in (pytest's tmp_path goes)
    folder = Path(os.environ.get("HOTPLATE_TEST_SHEETS", tmp_path))
    sheet = write_sheet(folder / "footage_bank_sheet.png", frames, rendered, under, asked)
    print(f"sheet (as shot above, rendered below, consecutive frames): {sheet}")
    assert r_new >= FOLLOWS
    assert abs(r_own) <= OWN_WORDS


def write_sheet(path: Path, frames, rendered, under, asked, run: int = 8) -> Path:
    """2x mouth crops of `run` consecutive output frames, twice (where the new speech
    opens the mouth most, and where the search cuts most often): above, the stored frame
    as shot under each; below, the render."""
    import cv2

    from testkit.referee import referee_points

    pts = referee_points(frames[0])
    half = int(np.linalg.norm(pts[54] - pts[48]))  # a mouth width
    cx, cy = pts[48:68].mean(0).astype(int)
    n = len(rendered)
    loud = int(np.argmax(np.convolve(asked[:n], np.ones(run), "valid")))
    starts = [loud, (loud + n // 2) % max(n - run, 1)]

    def cell(image: np.ndarray) -> np.ndarray:
        crop = image[cy - half // 2 : cy + 3 * half // 4, cx - 3 * half // 4 : cx + 3 * half // 4]
        return cv2.resize(crop, None, fx=2, fy=2, interpolation=cv2.INTER_CUBIC)

    rows = []
    for s in starts:
        ts = range(s, min(s + run, n))
        rows.append(np.concatenate([cell(frames[int(under[t])]) for t in ts], axis=1))
        rows.append(np.concatenate([cell(rendered[t]) for t in ts], axis=1))
    sheet = np.concatenate(rows, axis=0)[..., ::-1]
    cv2.imwrite(str(path), sheet, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    return path
