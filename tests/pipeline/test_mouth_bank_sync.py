"""Footage whose sound sits off its pictures: the bank aligns them before it fits its model.

A camera or an edit can leave a presenter's footage with its sound a few frames late. A
bank fitted on it as shot learns the offset (its cross-validation cannot see it: both
sides carry it) and moves every render's mouth that much ahead of its speech. The bank
reads the offset with the ear, which was trained on footage in sync and knows no speaker
(`pipeline.mouth.bank.sound_offset`), and fits its model on the footage aligned.

The footage is real: GRID's talker (testkit/footage/: grid_s1, CC BY 4.0), its first
16 s with the sound moved 3 frames (120 ms) late, written as a persona's `speech.mp4`
and precompiled. The bank's model is then given the next 8 s of his speech, in sync,
and judged by the referee (dlib, testkit/referee.py) on those frames as shot: the mouth
it predicts must follow his lips at the lag a bank of the same 16 s in sync does, within
half a frame (each lag the peak of r by lag, refined between frames by a parabola). In
sync the bank's mouth trails his lips by about a frame (-0.95; r -1 0.722, 0 0.707);
fitted as shot on the late footage it led them by 2 (+2.03, r +2 0.704): 2.96 frames
off; aligned a frame short (2 of the 3) -0.02, 0.93 off, where a whole-frame peak (0)
passed the old bound of a frame either side of 0; aligned, -1.01, 0.06 off.
"""

from __future__ import annotations

import numpy as np
import pytest

from cachestore.store import forget_store, open_store
from pipeline.catalog import bank_info, bank_plan, describe_bank
from pipeline.hot import load_bank
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile_source
from testkit.mouth_fixtures import correlation, referee_gaps

pytestmark = pytest.mark.slow  # real footage, a precompile, the referee on 200 frames

CLIP = "grid_s1"
BANK_FRAMES = 400  # 16 s of footage
HELD_FRAMES = 200  # the next 8 s, rendered from their sound
LATE = 3  # frames the footage's sound is moved late (120 ms at 25 fps)
LAGS = range(-4, 5)


def banked(tmp, frames_late: int):
    """(store, the bank's key, the clip) of a speech.mp4 of the clip's first BANK_FRAMES,
    its sound `frames_late` frames late (silence before, its end cut)."""
    from testkit import footage

    clip = footage.load(CLIP)
    sound = clip.audio[: clip.samples_at(BANK_FRAMES)]
    shift = clip.samples_at(frames_late)
    sound = np.concatenate([np.zeros(shift, sound.dtype), sound[: sound.size - shift]])
    speech = footage.write_clip(
        tmp / "speech.mp4", clip.frames[:BANK_FRAMES], sound, clip.sr, clip.fps
    )
    store = open_store(tmp / "store")
    recipe = Recipe(max_frames=0)
    precompile_source(speech, recipe, store)
    return store, bank_plan(store, speech, recipe, "speech").avatar, clip


@pytest.fixture(scope="module")
def late_footage(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bank_sync")
    yield banked(tmp, LATE)
    forget_store(tmp / "store")


@pytest.fixture(scope="module")
def sync_footage(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bank_in_sync")
    yield banked(tmp, 0)
    forget_store(tmp / "store")


def test_footage_in_sync_is_fitted_as_shot(sync_footage):
    store, key, _ = sync_footage
    assert store.get_avatar(key)["sound_late"]["late"] == 0
    assert "its sound" not in describe_bank(bank_info(store, key))


def test_the_bank_finds_the_footages_sound_late_and_says_so(late_footage):
    store, key, _ = late_footage
    manifest = store.get_avatar(key)
    assert manifest["sound_late"]["late"] == LATE, manifest["sound_late"]
    info = bank_info(store, key)
    assert info["sound_late_ms"] == 120
    assert "its sound 120 ms after its pictures (aligned)" in describe_bank(info)


def r_by_lag(footage) -> dict[int, float]:
    """r of the bank's predicted opening for the held-out frames against the referee's
    lip gap, by lag: the prediction for frame t against the lips at t + lag."""
    store, key, clip = footage
    bank = load_bank(store, key)
    start, end = BANK_FRAMES, BANK_FRAMES + HELD_FRAMES
    sound = clip.audio[clip.samples_at(start) : clip.samples_at(end)]
    opening = bank.predict(sound, clip.sr, clip.fps, HELD_FRAMES)[:, 0]
    gaps = referee_gaps(list(clip.frames[start:end]))

    def r_at(lag: int) -> float:
        a = opening[max(0, -lag) : HELD_FRAMES - max(0, lag)]
        return correlation(a, gaps[max(0, lag) : HELD_FRAMES - max(0, -lag)])

    return {lag: r_at(lag) for lag in LAGS}


def peak(r: dict[int, float]) -> float:
    """The lag where r peaks, between frames: the parabola through the best lag and its
    neighbours (the best lag itself at the range's edge). r at neighbouring lags differs
    by some 0.02, so a whole-frame peak can land a frame either side; the refined one
    moves by a tenth of a frame from run to run."""
    best = max(r, key=r.get)
    if best - 1 not in r or best + 1 not in r:
        return float(best)
    before, at, after = r[best - 1], r[best], r[best + 1]
    curve = before - 2 * at + after
    return best + (0.5 * (before - after) / curve if curve < 0 else 0.0)


def test_its_model_moves_the_mouth_as_a_bank_of_footage_in_sync_does(late_footage, sync_footage):
    late, in_sync = r_by_lag(late_footage), r_by_lag(sync_footage)
    for name, r in (("late, aligned", late), ("in sync", in_sync)):
        print(f"{name}: peak {peak(r):+.2f}; " + ", ".join(f"{k:+d} {v:.3f}" for k, v in r.items()))
    assert abs(peak(in_sync)) <= 1.5, in_sync  # the yardstick: about a frame behind
    # the late footage's bank, aligned, where the in-sync one is: as shot it was 2.96
    # frames ahead, aligned a frame short 0.93 (module doc)
    assert abs(peak(late) - peak(in_sync)) <= 0.5, (late, in_sync)
