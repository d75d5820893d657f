"""The phones' opening (pipeline/mouth/visemes.py): PocketSphinx's phone recogniser, its
model from inside the pip package, on real speech from espeak-ng; open vowels open the
mouth wider than close ones, silence shuts it, and the rate the audio comes at does not
change what is heard."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.mouth.visemes import OPENING, forget, phone_opening, phones
from pipeline.render.audio import load_audio
from testkit.mouth_fixtures import espeak

FPS = 25.0
OPEN_VOWELS = "Father saw the calm hot cars."  # aa, ao: the jaw drops
CLOSE_VOWELS = "We need three sweet peas."  # iy: nearly shut


def opening_of(text: str, tmp_path, sr: int = 16000) -> np.ndarray:
    wav = espeak(text, tmp_path / f"{abs(hash(text))}.wav")
    audio = load_audio(wav, sr)
    return phone_opening(audio, sr, FPS, int(audio.size / sr * FPS))


def test_open_vowels_open_the_mouth_wider_than_close_ones(tmp_path):
    wide, shut = opening_of(OPEN_VOWELS, tmp_path), opening_of(CLOSE_VOWELS, tmp_path)
    for got in (wide, shut):
        assert got.dtype == np.float32 and 0.0 <= got.min() and got.max() <= 1.0
    # measured 0.457 and 0.294 over the frames that open at all
    assert wide[wide > 0.05].mean() > shut[shut > 0.05].mean() + 0.1


def test_the_recogniser_hears_phones_it_has_an_opening_for(tmp_path):
    wav = espeak(OPEN_VOWELS, tmp_path / "speech.wav")
    heard = phones(load_audio(wav, 16000), 16000)
    labels = [p for p, _, _ in heard]
    assert labels[0] == "SIL" and {"AA", "AO"} & set(labels), labels
    assert all(p in OPENING for p in labels), labels
    assert all(a <= b for (_, a, _), (_, b, _) in zip(heard, heard[1:], strict=False))


def test_silence_is_shut_and_the_length_is_the_frames_asked_for():
    got = phone_opening(np.zeros(16000, np.float32), 16000, FPS, 30)
    assert got.shape == (30,) and not got.any()
    assert phone_opening(np.zeros(0, np.float32), 16000, FPS, 5).shape == (5,)


@pytest.mark.parametrize("sr", [22050, 44100])
def test_the_audio_rate_does_not_change_what_is_heard(sr, tmp_path):
    at_16k = opening_of(OPEN_VOWELS, tmp_path)
    other = opening_of(OPEN_VOWELS, tmp_path, sr)
    n = min(at_16k.size, other.size)
    assert np.corrcoef(at_16k[:n], other[:n])[0, 1] > 0.8


def test_the_same_audio_is_heard_the_same_after_other_audio(tmp_path):
    """A decoder carries what it heard into its next utterance; each is heard afresh, so
    a stream shows what its file shows."""
    a = load_audio(espeak(OPEN_VOWELS, tmp_path / "a.wav"), 16000)
    b = load_audio(espeak(CLOSE_VOWELS, tmp_path / "b.wav"), 16000)
    forget()
    first = phones(a, 16000)
    phones(b, 16000)
    forget()  # heard again, not read back from what was kept
    assert phones(a, 16000) == first


def test_what_was_heard_is_kept_by_its_audio(tmp_path):
    """An editor previews, streams and exports the same speech: its pieces are heard
    once. Kept by content, not by the array: a copy is found, other audio is not."""
    from pipeline.mouth import visemes

    a = load_audio(espeak(OPEN_VOWELS, tmp_path / "a.wav"), 16000)
    forget()
    first = phones(a, 16000)
    kept = dict(visemes._heard)
    assert len(kept) == 1
    got = phones(a.copy(), 16000)
    assert got == first and dict(visemes._heard) == kept  # found, nothing heard anew
    got.append(("AA", 0, 0))  # a caller's list is its own
    assert phones(a, 16000) == first
    phones(a[: a.size // 2], 16000)
    assert len(visemes._heard) == 2


def test_a_render_starts_on_the_first_piece_and_reads_what_a_whole_hearing_gives(tmp_path):
    """The pieces cover every frame in order, none longer than PIECE s (the first no
    longer than FIRST_PIECE s); frames read as the thread hears the rest are final, and
    equal to `phone_opening`'s."""
    from pipeline.mouth.visemes import FIRST_PIECE, PIECE, PIECE_LEAST, PhoneTrack, pieces

    text = " ".join([OPEN_VOWELS, CLOSE_VOWELS] * 3)
    audio = load_audio(espeak(text, tmp_path / "long.wav"), 16000)
    n = int(audio.size / 16000 * FPS)
    got = pieces(audio, 16000, FPS, n)
    assert got[0][0] == 0 and got[-1][1] == n and len(got) > 2, got
    assert all(a[1] == b[0] for a, b in zip(got, got[1:], strict=False)), got
    assert got[0][1] <= FIRST_PIECE * FPS
    assert all(PIECE_LEAST * FPS <= b - a <= PIECE * FPS for a, b in got[1:-1]), got
    forget()
    track = PhoneTrack(audio, 16000, FPS, n)
    early = [float(track.wait(t)[t]) for t in range(n)]  # each frame as soon as it is final
    forget()  # the whole hearing heard afresh
    assert early == phone_opening(audio, 16000, FPS, n).tolist()
    assert track.heard.tolist() == early


@pytest.mark.parametrize(
    ("lookahead", "cue", "share", "hears"),
    [
        (3, None, 0.0, True),  # the procedural mouth reads them
        (3, "phones", 0.5, True),
        (3, "phones", 0.0, False),  # a bank that takes its model alone
        (3, "loudness", 0.5, False),
        (1, None, 0.0, False),  # live: one frame ahead
    ],
)
def test_a_render_hears_the_phones_only_where_its_mouth_reads_them(lookahead, cue, share, hears):
    from types import SimpleNamespace

    from pipeline.render.renderers.warp import WarpRenderer

    bank = (
        None if cue is None else SimpleNamespace(drive_cue=cue, drive_share=share, has_model=True)
    )
    assert WarpRenderer(lookahead=lookahead)._hears_phones(bank) is hears
    if cue is not None:  # a bank of footage without speech has no model: the drive reads them
        silent = SimpleNamespace(drive_cue=cue, drive_share=share, has_model=False)
        assert WarpRenderer(lookahead=lookahead)._hears_phones(silent) is (lookahead >= 3)
