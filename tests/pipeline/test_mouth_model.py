"""The mouth bank's audio model (pipeline/mouth/bank.py `fit_model`): fitted on a few
seconds of a presenter's speech, it predicts their mouth for speech it never heard.

The speech is made here: vowel-like bursts (a tone at one of four pitches, 4-8 frames
each, with a little noise), each with its own opening, and the mouth opens three frames
*before* each burst is heard, as a real mouth moves towards a sound before it starts.
A model that reads one frame ahead cannot know the next burst in time (the bank's first
model, 3 frames back and 1 ahead, ridge penalty 1: held-out r 0.24 here).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.mouth.bank import MouthBank, drive_share, fit_model, normalise, speech_frames
from pipeline.mouth.features import log_mel, windowed

SR, FPS = 16000, 25.0
HOP = int(SR / FPS)
LEAD = 3  # frames the mouth moves before the sound
PITCHES = (300.0, 700.0, 1500.0, 3000.0)  # Hz
OPENINGS = (0.05, 0.3, 0.15, 0.0)  # canonical units, one per pitch
FOLLOWS = 0.8  # r of the prediction against the held-out opening


def speech(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n frames of audio at SR, (n, 3) shapes whose opening leads the sound by LEAD)."""
    rng = np.random.default_rng(seed)
    audio = np.zeros(n * HOP, np.float32)
    opening = np.zeros(n, np.float32)
    t = 0
    while t < n:
        length, k = int(rng.integers(4, 9)), int(rng.integers(0, len(PITCHES)))
        piece = audio[t * HOP : (t + length) * HOP]
        tt = np.arange(piece.size) / SR
        piece[:] = 0.3 * np.sin(2 * np.pi * PITCHES[k] * tt) + 0.01 * rng.standard_normal(tt.size)
        opening[max(0, t - LEAD) : max(0, t + length - LEAD)] = OPENINGS[k]
        t += length
    shapes = np.stack([opening, np.ones(n), 0.5 + opening], 1).astype(np.float32)
    return audio, shapes


def test_the_model_reads_ahead_and_follows_speech_it_never_heard():
    n_fit, n_new = 150, 100  # 6 s of footage, 4 s of new speech
    audio, shapes = speech(1, n_fit)
    feats = normalise(log_mel(audio, SR, FPS, n_fit), speech_frames(audio, SR, FPS, n_fit))
    model, scores = fit_model(windowed(feats), shapes)
    share = drive_share(scores.pop("cv_opening"), shapes, audio, FPS, n_fit, np.arange(n_fit))
    # every burst is as loud as the next: loudness says nothing of the opening
    assert share["share"] == 0.0, share
    assert scores["cv_r"] >= FOLLOWS, scores
    bank = MouthBank(
        "k",
        shapes,
        np.zeros((n_fit, 20, 2), np.float32),
        np.arange(n_fit, dtype=np.int32),
        model["model_w"],
        model["model_mean"],
        model["model_std"],
        (model["model_w"], model["model_mean"], model["model_std"]),  # not read here
        [],
        FPS,
        share["share"],
    )
    new_audio, truth = speech(2, n_new)
    got = bank.predict(new_audio, SR, FPS, n_new)
    r = float(np.corrcoef(got[:, 0], truth[:, 0])[0, 1])
    print(f"held out: r = {r:.3f} (cross-validated on the footage: {scores['cv_r']:.3f})")
    assert r >= FOLLOWS


@pytest.mark.parametrize("cue", ["phones", "loudness"])
def test_the_drive_cue_is_the_one_the_footage_follows(cue, tmp_path):
    """On espeak-ng's speech, a mouth that opens as the phones say (or as loudness says)
    gets that cue: the blend of it with the model follows the footage best."""
    from pipeline.mouth.visemes import phone_opening
    from pipeline.render.audio import load_audio
    from pipeline.render.mouth.drive import mouth_drive
    from testkit.mouth_fixtures import SENTENCES, espeak

    audio = load_audio(espeak(SENTENCES, tmp_path / "speech.wav"), SR)
    n = int(audio.size / SR * FPS)
    opens = {
        "phones": phone_opening(audio, SR, FPS, n),
        "loudness": mouth_drive(audio, SR, FPS, n).open,
    }
    opening = 0.02 + 0.3 * opens[cue] + 0.01 * np.random.default_rng(0).standard_normal(n)
    shapes = np.stack([opening, np.ones(n), 0.5 + opening], 1).astype(np.float32)
    feats = normalise(log_mel(audio, SR, FPS, n), speech_frames(audio, SR, FPS, n))
    _, scores = fit_model(windowed(feats), shapes)
    got = drive_share(scores["cv_opening"], shapes, audio, FPS, n, np.arange(n))
    assert got["cue"] == cue and got["share"] > 0.0, got
    assert got["r"] > scores["cv_r"], (got, scores["cv_r"])
