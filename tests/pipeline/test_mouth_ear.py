"""The ear (pipeline/mouth/ear.py): audio to mouth shape, trained once on GRID's talker.

Real footage throughout: testkit/footage/grid_s1.mp4 joins 14 GRID sentences the
shipped weights were never trained on (`ear.TEST_SENTENCES` are always held out), and
the HDTF clips are people the ear never heard. The referee (dlib, testkit/referee.py)
judges, never the face mesh the ear was trained on.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.mouth import ear

SECONDS = 10.0  # of grid_s1 judged (250 frames)
STEP = 2  # every 2nd frame judged by the referee
FLOOR = 0.5  # r of the ear's opening against the referee's lip gap on grid_s1's first 10 s
OTHERS = 0.5  # ... its mean over the sentences of GRID talkers it never heard


@pytest.fixture(scope="module")
def grid():
    from testkit import footage

    return footage.load("grid_s1")


def test_the_shipped_weights_load_and_say_where_they_come_from():
    got = ear.load()
    n_in = len(ear.PHONES) + ear.N_CEPS
    assert got.weights.shape == (n_in * len(got.context) + 1, 2)
    assert np.isfinite(got.weights).all()
    assert got.meta["speakers"] and got.meta["held_out_sentences"] > 0
    assert (got.wide > got.rest).all()
    sources = (ear.WEIGHTS.parent / "SOURCES.md").read_text()
    assert "CC BY 4.0" in sources and "7cdd534e95aa989d9ce61c8739c64563bc496d01" in sources


@pytest.fixture(scope="module")
def gaps(grid) -> np.ndarray:
    """The referee's lip gap on every STEP-th frame of grid_s1's first SECONDS."""
    from testkit import mouth_fixtures as fx
    from testkit.referee import referee_points

    out = []
    for image in grid.frames[: int(SECONDS * grid.fps) : STEP]:
        pts = referee_points(image)
        out.append(np.nan if pts is None else fx.lip_gap(pts))
    return np.array(out)


def test_the_ear_follows_a_real_utterance_it_was_not_trained_on(grid, gaps):
    n = int(SECONDS * grid.fps)
    audio = grid.audio[: grid.samples_at(n)]
    opening = ear.load().openness(audio, grid.sr, grid.fps, n)
    r = ear.correlation(opening[::STEP], gaps)
    assert r > FLOOR, f"the ear's opening follows the referee's lip gap at r {r:.3f}"
    assert opening.min() < 0.05 < 0.5 < opening.max()  # shut in the pauses, open in speech


def test_the_ear_follows_grid_talkers_it_never_heard():
    """Ten sentences of nine GRID talkers other than s1, the one it was trained on
    (testkit/footage/grid_others.mp4), each heard whole and judged by the referee on
    every frame: the ear's opening follows their lip gap at r OTHERS on average and
    better than the phones' opening table. (Not HDTF's people: there it still loses to
    the table, docs/notebook/ear.md.)"""
    from testkit.mouth_fixtures import ear_by_sentence

    heard, told = ear_by_sentence("grid_others")
    print("ear", np.round(heard, 3), "table", np.round(told, 3))
    assert len(heard) == 10
    assert np.mean(heard) > OTHERS and np.mean(heard) > np.mean(told), (heard, told)


def test_the_drive_with_the_ear_hears_it_in_pieces_and_beats_the_phones_table(grid, gaps):
    """A whole-file render's drive with the ear (`HOTPLATE_EAR=on`; `ear=True` here): the
    ear heard piece by piece as the render runs, its opening and spread final per frame,
    following the referee's lip gap better than the phones' opening table does."""
    from pipeline.render.mouth.drive import mouth_drive

    n = int(SECONDS * grid.fps)
    audio = grid.audio[: grid.samples_at(n)]
    by_ear = mouth_drive(audio, grid.sr, grid.fps, n, phones=True, ear=True)
    assert len(by_ear.phones.pieces) > 2  # heard in pieces, not whole
    opening = by_ear.ready().copy()
    assert np.isfinite(opening).all() and np.abs(by_ear.spread).max() > 0.1
    by_table = mouth_drive(audio, grid.sr, grid.fps, n, phones=True, ear=False).ready()
    r_ear = ear.correlation(opening[::STEP], gaps)
    r_table = ear.correlation(by_table[::STEP], gaps)
    assert r_ear > FLOOR and r_ear > r_table, f"ear r {r_ear:.3f}, phones' table r {r_table:.3f}"


def test_training_runs_end_to_end_on_real_clips(grid, tmp_path):
    """Six 1.6 s pieces of grid_s1 as one speaker's sentences: the script extracts,
    fits, writes weights that load and follow what they were fitted on."""
    from testkit.footage import write_clip

    data = tmp_path / "data" / "s1"
    data.mkdir(parents=True)
    length, pieces = 40, 6  # frames a piece
    for k in range(pieces):
        a, b = k * length, (k + 1) * length
        write_clip(
            data / f"piece{k}.mp4",
            grid.frames[a:b],
            grid.audio[grid.samples_at(a) : grid.samples_at(b)],
            grid.sr,
            grid.fps,
        )
    out = tmp_path / "ear.npz"
    assert ear.main(["train", "--data", str(tmp_path / "data"), "--out", str(out)]) == 0
    made = ear.load(out)
    assert made.meta["speakers"] == ["s1"]
    assert made.meta["train_sentences"] + made.meta["held_out_sentences"] == pieces
    fitted_on = next(k for k in range(pieces) if not ear.held_out(f"piece{k}"))
    clip = ear.extract(data / f"piece{fitted_on}.mp4", tmp_path / "data" / ".ear-cache")
    fitted = made.predict_features(clip["feats"])[:, 0]
    assert ear.correlation(fitted, clip["shapes"][:, 0]) > 0.5
    # its cache: a second run reads the features instead of extracting them again
    assert len(list((tmp_path / "data" / ".ear-cache").glob("*.npz"))) == pieces


def test_a_folder_with_no_clips_is_one_line(tmp_path, capsys):
    assert ear.main(["train", "--data", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(tmp_path) in err and "<speaker>" in err


def test_the_setting_turns_the_ear_on_for_a_render_without_a_bank(grid, monkeypatch):
    from pipeline.render.mouth.drive import EAR_SETTING, mouth_drive

    n = 100
    audio = grid.audio[: grid.samples_at(n)]
    monkeypatch.setenv(EAR_SETTING, "on")
    by_setting = mouth_drive(audio, grid.sr, grid.fps, n, phones=True).ready().copy()
    by_ear = mouth_drive(audio, grid.sr, grid.fps, n, phones=True, ear=True).ready().copy()
    with_bank = mouth_drive(audio, grid.sr, grid.fps, n, phones=True, ear=False).ready().copy()
    monkeypatch.setenv(EAR_SETTING, "off")
    by_default = mouth_drive(audio, grid.sr, grid.fps, n, phones=True).ready().copy()
    np.testing.assert_array_equal(by_setting, by_ear)
    np.testing.assert_array_equal(by_default, with_bank)
    assert np.abs(by_ear - by_default).max() > 0.1


def test_a_presenter_s_footage_calibrates_the_ear_to_their_own_mouth(grid, tmp_path):
    """The presenter's mouths (the face mesh on grid_s1's first 4 s, as a bank holds
    them) set the ear's rest and scale for the next 4 s: in the presenter's canonical
    units its opening follows theirs and sits in their range."""
    from testkit.footage import write_clip

    cut, n = 100, 200
    piece = write_clip(
        tmp_path / "next.mp4",
        grid.frames[cut:n],
        grid.audio[grid.samples_at(cut) : grid.samples_at(n)],
        grid.sr,
        grid.fps,
    )
    shapes, _, _, _ = ear.clip_shapes(piece)
    bank = write_clip(
        tmp_path / "bank.mp4",
        grid.frames[:cut],
        grid.audio[: grid.samples_at(cut)],
        grid.sr,
        grid.fps,
    )
    presenter, _, _, _ = ear.clip_shapes(bank)
    heard = ear.load()
    got = heard.calibrated(
        heard.predict(
            grid.audio[grid.samples_at(cut) : grid.samples_at(n)], grid.sr, grid.fps, n - cut
        ),
        presenter,
    )
    assert ear.correlation(got[:, 0], shapes[:, 0]) > FLOOR
    # the same scale as the presenter's own: rest width within 10 %, openings within 2x
    assert abs(np.median(got[:, 1]) / np.median(shapes[:, 1]) - 1.0) < 0.1
    ratio = np.percentile(got[:, 0], 90) / np.percentile(shapes[:, 0], 90)
    assert 0.5 < ratio < 2.0, ratio
