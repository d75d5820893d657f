"""The mouth rests during silence: speech, silence (with breath noise), speech."""

import numpy as np
import pytest

from hotplate.demo_data import make_speech_audio
from pipeline.render.renderers.musetalk import MuseTalkRenderer
from pipeline.render.renderers.warp import WarpRenderer
from pipeline.render.silence import SilenceParams, rest_weight, speech_weight
from testkit.render_fixtures import build_assets, full_mask, tiny_musetalk_avatar

FPS = 25.0


def talk_pause_talk(sr: int, pause: float = 1.2, noise_db: float = -27.0) -> np.ndarray:
    """1.5 s of speech, `pause` s of breath noise `noise_db` below the speech level (as
    the loudness envelope measures it: 95th percentile of frame RMS), 1.5 s of speech.
    At -27 dB the envelope (30 dB range) still opens the mouth a little: mumbling."""
    from pipeline.render.audio import frame_rms

    a = make_speech_audio(1.5, sr, seed=1)
    b = make_speech_audio(1.5, sr, seed=2)
    rms = frame_rms(np.concatenate([a, b]), sr, FPS)
    level = np.percentile(20 * np.log10(rms[rms > 1e-4]), 95)
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(int(pause * sr)).astype(np.float32)
    noise *= 10 ** ((level + noise_db) / 20) / np.sqrt(np.mean(noise**2))
    return np.concatenate([a, noise, b]).astype(np.float32)


def test_rest_weight_fades_inside_the_silence_and_is_back_for_speech():
    p = SilenceParams(min_silence=0.3, fade=0.12)
    quiet = np.zeros(100, bool)
    quiet[20:25] = True  # 0.2 s: a gap between words, not a rest
    quiet[40:70] = True  # 1.2 s: a rest
    w = rest_weight(quiet, FPS, p)
    assert (w[:40] == 1).all() and (w[70:] == 1).all()
    assert (w[45:66] == 0).all()  # rests in the middle
    ramp = round(p.fade * FPS)
    assert np.abs(np.diff(w)).max() <= 1 / ramp + 1e-6  # no jump in or out
    assert w[39] == 1 and w[69] > 0 and w[70] == 1
    # the thresholds are parameters: the 0.2 s gap rests with min_silence 0.15
    assert rest_weight(quiet, FPS, SilenceParams(min_silence=0.15))[22] < 1
    assert (rest_weight(quiet, FPS, SilenceParams(min_silence=1.5)) == 1).all()


def test_speech_weight_finds_the_pause():
    from pipeline.render.audio import loudness_envelope

    sr = 16000
    audio = talk_pause_talk(sr)
    w = speech_weight(audio, sr, FPS)
    pause = slice(int(1.5 * FPS) + 4, int(2.7 * FPS) - 4)
    assert (w[pause] == 0).all()
    loud = loudness_envelope(audio, sr, FPS, smooth=None) > 0.5
    assert loud.sum() > 20 and (w[loud] == 1).all()  # speech itself never rests
    # breath noise 27 dB down counts as quiet; with a 30 dB threshold it does not
    loose = speech_weight(talk_pause_talk(sr), sr, FPS, SilenceParams(silence_db=30.0))
    assert (loose[pause] == 1).all()


def test_warp_holds_the_closed_pose_during_silence_without_a_pop():
    sr = 48000
    audio = talk_pause_talk(sr)
    n = int(round(audio.size / sr * FPS))
    assets = build_assets(6)
    resting, talking = WarpRenderer(), WarpRenderer(silence=None)
    for r in (resting, talking):
        r.prepare(assets, audio, sr, n, FPS)
    o, o_raw = resting.openness(), talking.openness()
    pause = slice(int(1.5 * FPS) + 4, int(2.7 * FPS) - 4)
    assert o_raw[pause].max() > 0.05  # without the rest the breath noise mumbles
    assert (o[pause] == 0).all()
    # the stored frame, bit for bit, while it rests
    for t in range(pause.start, pause.stop, 5):
        i = t % assets.n_frames
        stored = assets.load_frame(i)
        assert np.array_equal(resting.render(t, i, stored), stored)
    # speech is untouched outside the fades, and resumes without a jump
    assert np.allclose(o[: int(1.5 * FPS) - 3], o_raw[: int(1.5 * FPS) - 3])
    resume = int(2.7 * FPS)
    assert np.abs(np.diff(o[resume - 6 : resume + 6])).max() <= np.abs(np.diff(o_raw)).max()


@pytest.fixture(scope="module")
def musetalk(tmp_path_factory):
    return tiny_musetalk_avatar(tmp_path_factory.mktemp("models"))


def test_musetalk_blends_back_to_the_stored_frame_during_silence(musetalk):
    models, assets = musetalk
    sr = 16000
    audio = talk_pause_talk(sr)
    n = int(round(audio.size / sr * FPS))
    r = MuseTalkRenderer(models, device="cpu")
    r.prepare(assets, audio, sr, n, FPS)
    rest = int(2.1 * FPS)  # the middle of the pause
    fade = next(t for t in range(rest, n) if 0 < r._speak[t] < 1)  # fading back in
    talk = int(0.8 * FPS)
    ts = [rest, fade, talk]
    idxs = [t % assets.n_frames for t in ts]
    frames = [assets.load_frame(i) for i in idxs]
    got = r.render_batch(ts, idxs, frames)
    assert np.array_equal(got[0], frames[0])  # no mumbling: the stored frame itself
    full = MuseTalkRenderer(models, device="cpu", silence=None)
    full.prepare(assets, audio, sr, n, FPS)
    ref = full.render_batch(ts, idxs, frames)
    m = full_mask(assets, idxs[1]) > 0
    # half way back: between the stored frame and the full redraw, never a jump to it
    d_part = np.abs(got[1][m].astype(int) - frames[1][m]).mean()
    d_full = np.abs(ref[1][m].astype(int) - frames[1][m]).mean()
    assert 0 < d_part < d_full
    assert np.array_equal(got[2], ref[2])  # speech: the full redraw
