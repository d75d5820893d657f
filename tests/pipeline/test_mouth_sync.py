"""The mouth moves with the speech, as the independent referee sees it (dlib's lip gap on
the rendered frames, testkit/referee.py), for a still and for a loop of real faces;
a live render and a whole-file render of the same speech agree."""

from __future__ import annotations

import numpy as np
import pytest

from cachestore.store import forget_store, open_store
from hotplate.demo_data import write_loop_video
from pipeline.hot import load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from pipeline.render.audio import load_audio, loudness_envelope
from pipeline.render.live import live_render
from pipeline.render.video import render_video
from testkit import faces
from testkit.faces import make_variant
from testkit.mouth_fixtures import (
    SENTENCES,
    correlation,
    espeak,
    referee_gaps,
    still_assets,
    video_frames,
)
from testkit.referee import referee_points

pytestmark = pytest.mark.slow  # end to end: real faces, renders, the referee on every frame

FOLLOWS = 0.6  # r of the referee's gap against the speech envelope (the bound)
# r of the referee's gap, live against whole file, both by loudness (a whole file's
# default, the phones, is another cue: live cannot hear a phone a frame ahead): live looks one frame
# ahead where a whole file looks three (co-articulation) and takes its loudness
# reference from a 4 s window, so the two are close, not equal: measured 0.895 on the mouth's branch, 0.848
# on main from the I420 hot path's merge on (40d63e2 and later, deterministic here, cause
# not found); 0.8 is the bound the bank's live test (test_mouth_bank.py) has
AGREE = 0.8
FPS = 25.0


@pytest.fixture(scope="module")
def wav(tmp_path_factory):
    return espeak(SENTENCES, tmp_path_factory.mktemp("speech") / "speech.wav")


def envelope(wav) -> np.ndarray:
    return loudness_envelope(load_audio(wav, 16000), 16000, FPS)


@pytest.mark.parametrize("name", ["grace_hopper", "luispedro"])
def test_a_still_mouth_follows_the_speech(name, wav, tmp_path):
    face = faces.samples((name,), ("upright",))[0].image
    out = render_video(still_assets(face), wav, tmp_path / "still.mp4").out_path
    gaps = referee_gaps(video_frames(out), 2)
    r = correlation(envelope(wav)[::2], gaps)
    print(f"{name} still: r = {r:.3f}")
    assert r >= FOLLOWS


@pytest.fixture(scope="module")
def loop_assets(tmp_path_factory):
    """A 40-frame loop of a real face (takeo) rocking 4 degrees either way,
    precompiled as any loop is."""
    src = faces.source_images("takeo")[0][1]
    points = referee_points(src)
    frames = [
        make_variant(src, points, 4 * np.sin(2 * np.pi * t / 40), 300, "", "")[0] for t in range(40)
    ]
    tmp = tmp_path_factory.mktemp("loop")
    video = write_loop_video(tmp / "loop.mp4", frames, fps=FPS)
    store = open_store(tmp / "store")
    yield load_assets(store, precompile(video, Recipe(), store).avatar)
    forget_store(tmp / "store")


def test_a_loop_mouth_follows_the_speech(loop_assets, wav, tmp_path):
    out = render_video(loop_assets, wav, tmp_path / "loop.mp4").out_path
    r = correlation(envelope(wav)[::2], referee_gaps(video_frames(out), 2))
    print(f"loop: r = {r:.3f}")
    assert r >= FOLLOWS


def whole_by_loudness(assets, wav) -> list[np.ndarray]:
    """The whole-file render's frames with the mouth opened by loudness, as live opens
    it (a whole file reads the phones by default; live cannot hear a phone a frame
    ahead)."""
    from pipeline.render.renderers.warp import WarpRenderer
    from pipeline.render.schedule import schedule

    r = WarpRenderer(phones=False)
    audio = load_audio(wav, r.sample_rate)
    n = int(audio.size / r.sample_rate * FPS)
    r.prepare(assets, audio, r.sample_rate, n, FPS)
    idxs = schedule(n, assets.n_frames, "pingpong")
    return [r.render(t, int(i), assets.load_frame(int(i))) for t, i in enumerate(idxs)]


def test_live_and_whole_file_renders_agree(loop_assets, wav, tmp_path):
    """The same speech, whole and as it is spoken (20 ms chunks, one frame of look-ahead,
    the loudness of a 4 s window), both opened by loudness: the referee sees the same
    mouth."""
    whole = whole_by_loudness(loop_assets, wav)
    pcm = (load_audio(wav, 16000) * 32767).astype("<i2").tobytes()
    segments = []
    live_render(
        loop_assets,
        (pcm[i : i + 640] for i in range(0, len(pcm), 640)),
        16000,
        1,
        lambda kind, data: segments.append(data),
    )
    (tmp_path / "live.mp4").write_bytes(b"".join(segments))
    live = video_frames(tmp_path / "live.mp4")
    n = min(len(whole), len(live))
    r = correlation(referee_gaps(whole[:n], 2), referee_gaps(live[:n], 2))
    print(f"live vs whole: r = {r:.3f} over {n} frames")
    assert r >= AGREE
