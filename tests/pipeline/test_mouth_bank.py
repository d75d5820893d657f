"""The mouth bank: a persona with talking footage speaks with its own mouths.

The talking footage is made from a real face (grace_hopper, matplotlib's sample photo)
speaking espeak-ng's speech, its mouth opened by a known warp (`talking_clip`): no real
talking clip with its own audio ships in a package. It goes into a personas folder as a
loop (`talk.mp4`) and is precompiled as the watcher does it (avatar and bank); the
referee (dlib, testkit/referee.py) judges the renders.
"""

from __future__ import annotations

import numpy as np
import pytest

from cachestore.store import forget_store, open_store
from pipeline.catalog import bank_info, bank_plan, persona_bank
from pipeline.hot import load_assets, load_bank
from pipeline.lip_sync import LipSyncRequest, lip_sync
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile_source
from pipeline.render.audio import load_audio, loudness_envelope
from testkit import faces
from testkit.mouth_fixtures import (
    SENTENCES,
    correlation,
    espeak,
    psnr,
    referee_gaps,
    talking_clip,
    video_frames,
)
from testkit.render_fixtures import full_mask

pytestmark = pytest.mark.slow  # end to end: real faces, renders, the referee on every frame

# the whole clip (about 11 s), its frames as shot: the clip rendered with its own speech
# is compared with itself inside the blend region, whose feathered edge shows the stored
# frame; a stilled loop (test_mouth_still.py) shows its lips at rest there instead
RECIPE = Recipe(max_frames=0, still="off")
# r of the referee's gap, output against source (the bank issue's bound): 0.833 on this
# clip, the same every run; the measure moves with the clip's pixels (0.753 on the same
# frames converted to I420 by cv2 instead of FFmpeg; docs/notebook/mouth.md, "The talking
# clip is the same clip every run"), so a fixture that changes them must be measured again
REPRODUCES = 0.8
FOLLOWS = 0.6  # r of the referee's gap against the speech envelope
OUTSIDE_DB = 40.0  # PSNR outside the mouth's blend square
OWN_MOUTHS_DB = 30.0  # median PSNR inside it, against the clip's own frames


@pytest.fixture(scope="module")
def persona(tmp_path_factory):
    """(personas root, store, speech wav, talking clip) with the clip's avatar and bank hot."""
    import cv2

    root = tmp_path_factory.mktemp("personas")
    (root / "grace").mkdir()
    face = faces.samples(("grace_hopper",), ("upright",))[0].image
    cv2.imwrite(str(root / "grace" / "portrait.png"), cv2.cvtColor(face, cv2.COLOR_RGB2BGR))
    wav = espeak(SENTENCES, root.parent / "speech.wav")
    clip = talking_clip(face, wav, root / "grace" / "talk.mp4")
    store = open_store(root.parent / "store")
    precompile_source(clip, RECIPE, store)
    yield root, store, wav, clip
    forget_store(root.parent / "store")


def test_a_talking_loop_gets_a_bank_with_its_own_mouths(persona):
    root, store, _, clip = persona
    info = bank_info(store, bank_plan(store, clip, RECIPE, "loop").avatar)
    assert info is not None and info["entries"] > 200, info  # ~11 s at 25 fps
    found = persona_bank(store, root, "grace", RECIPE)
    assert found is not None and found[1] == clip
    bank = load_bank(store, found[0])
    assert bank.size == info["entries"] and bank.crop(0).shape[2] == 3
    # its shapes open and close with the clip's speech, as the known warp opened them
    frames = len(video_frames(clip))
    env = loudness_envelope(load_audio(clip, 16000), 16000, 25.0)[:frames]
    assert correlation(env[bank.frame_index], bank.shapes[:, 0]) > 0.6


def test_the_clip_rendered_from_its_bank_reproduces_its_mouth(persona, tmp_path):
    """Its own audio through its bank: the referee's lip gap on the output follows the
    clip's own (r >= 0.8), and outside the mouth the frames are the stored ones."""
    root, store, wav, clip = persona
    out = tmp_path / "out.mp4"
    outcome = lip_sync(
        store, root, RECIPE, LipSyncRequest("grace", "talk", wav, out), default_loop="cycle"
    )
    rendered, source = video_frames(out), video_frames(clip)
    n = min(len(rendered), len(source))
    r = correlation(referee_gaps(source[:n], 2), referee_gaps(rendered[:n], 2))
    print(f"bank: r = {r:.3f} over {n} frames")
    assert outcome.bank is not None and r >= REPRODUCES
    assets = load_assets(store, outcome.avatar)
    # the mouths are the clip's own: inside the blend region the output is the source
    # (median 32.0 dB measured; the procedural mouth on the same clip gave 22 dB)
    inside = np.median(
        [
            psnr(rendered[t][full_mask(assets, t) > 0], source[t][full_mask(assets, t) > 0])
            for t in range(0, n, 5)
        ]
    )
    print(f"inside the mouth: PSNR median {inside:.1f} dB")
    assert inside >= OWN_MOUTHS_DB
    worst = min(
        psnr(
            rendered[t][full_mask(assets, t) == 0], assets.load_frame(t)[full_mask(assets, t) == 0]
        )
        for t in range(0, n, 10)
    )
    print(f"outside the mouth: PSNR min {worst:.1f} dB")
    assert worst >= OUTSIDE_DB


def test_a_still_of_the_persona_speaks_with_the_banks_mouths(persona, tmp_path):
    """Another attire (the portrait, a still) renders from the same bank, and its mouth
    follows new speech."""
    root, store, _, _ = persona
    wav = espeak("Bob bought a big blue balloon, and Mary made marmalade.", tmp_path / "b.wav")
    out = tmp_path / "still.mp4"
    lip_sync(store, root, RECIPE, LipSyncRequest("grace", "default", wav, out))
    rendered = video_frames(out)
    env = loudness_envelope(load_audio(wav, 16000), 16000, 25.0)
    r = correlation(env[::2], referee_gaps(rendered, 2))
    print(f"still from the bank: r = {r:.3f}")
    assert r >= FOLLOWS


def test_silence_rests_on_the_presenters_closed_mouth(persona, tmp_path):
    """In a pause the bank shows the presenter's closed mouth (and the referee sees it
    shut), then speech resumes from the bank."""
    import wave

    root, store, wav, _ = persona
    speech = load_audio(wav, 16000)[: 16000 * 3]
    audio = np.concatenate([speech, np.zeros(16000 * 2, np.float32), speech])
    path = tmp_path / "pause.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((audio * 32767).astype("<i2").tobytes())
    out = tmp_path / "pause.mp4"
    lip_sync(store, root, RECIPE, LipSyncRequest("grace", "default", path, out))
    gaps = referee_gaps(video_frames(out))
    pause = gaps[int(3.5 * 25) : int(4.6 * 25)]
    talking = gaps[: 3 * 25]
    print(f"pause: max gap {np.nanmax(pause):.3f}; talking: max {np.nanmax(talking):.3f}")
    assert np.nanmax(pause) <= 0.05 < np.nanmax(talking)


def test_live_renders_from_the_bank_agree_with_whole_files(persona, tmp_path):
    from pipeline.lip_sync import live_lip_sync

    root, store, wav, _ = persona
    whole = tmp_path / "whole.mp4"
    lip_sync(store, root, RECIPE, LipSyncRequest("grace", "default", wav, whole))
    pcm = (load_audio(wav, 16000) * 32767).astype("<i2").tobytes()
    segments = []
    live_lip_sync(
        store,
        root,
        RECIPE,
        LipSyncRequest("grace", "default", wav, tmp_path / "unused.mp4"),
        (pcm[i : i + 640] for i in range(0, len(pcm), 640)),
        16000,
        1,
        lambda kind, data: segments.append(data),
    )
    (tmp_path / "live.mp4").write_bytes(b"".join(segments))
    a, b = video_frames(whole), video_frames(tmp_path / "live.mp4")
    n = min(len(a), len(b))
    r = correlation(referee_gaps(a[:n], 2), referee_gaps(b[:n], 2))
    print(f"bank live vs whole: r = {r:.3f}")
    # live searches the bank per window (4 s back, one frame ahead), so it may pick
    # other runs of footage for the same shapes than the whole file's one search
    assert r >= 0.8
