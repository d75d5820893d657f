"""The loop frames a worker process decodes once and its sessions share
(pipeline/loop_frames.py), on a hot avatar in a real store: a session at rest shows each
stored frame as decoded, a second session of the avatar decodes nothing, a speaking
frame is its loop frame with the mouth pasted in (the shared planes left as they were),
and the budget keeps the frames in use and lets the stale ones go."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from cachestore.store import forget_store, open_store
from hotplate.demo_data import write_loop_video
from pipeline import loop_frames
from pipeline.frames import FrameSource
from pipeline.hot import load_assets
from pipeline.loop_frames import LoopFrames
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from pipeline.render.conversation import Conversation
from pipeline.render.schedule import frame_index
from pipeline.yuv import frame_from_planes, planes, to_rgb
from testkit.render_fixtures import speech

N = 6  # stored frames: a ping-pong period of 10
SIZE = (270, 480)


@pytest.fixture(scope="module")
def hot(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop-frames")
    video = write_loop_video(root / "loop.mp4", n_frames=N, size=SIZE)
    store = open_store(root / "cache")
    yield store, precompile(video, Recipe(), store).avatar
    forget_store(root / "cache")


@pytest.fixture
def decodes(monkeypatch):
    """A fresh process cache, and a count of the stored frames decoded to I420."""
    monkeypatch.setattr(loop_frames, "_SHARED", None)
    count = [0]
    yuv = FrameSource.yuv

    def counted(self, i):
        count[0] += 1
        return yuv(self, i)

    monkeypatch.setattr(FrameSource, "yuv", counted)
    return count


def i420(frame) -> list[np.ndarray]:
    return [p.copy() for p in planes(frame)]


def stored(assets, i: int) -> list[np.ndarray]:
    return i420(assets.load_frame.yuv(i))


def test_sessions_at_rest_decode_each_loop_frame_once_in_a_process(hot, decodes):
    store, key = hot
    assets = load_assets(store, key)
    with Conversation(assets) as conv:
        shown = [conv.next_frame() for _ in range(30)]  # three passes of the loop
    assert decodes[0] == N
    for t, f in enumerate(shown):  # the stored frame as decoded, pixel for pixel
        for got, want in zip(i420(f.video), stored(assets, frame_index(t, N)), strict=True):
            np.testing.assert_array_equal(got, want)
    assert len({id(f.video) for f in shown}) == len(shown)  # each its own pts to stamp
    decodes[0] = 0
    with Conversation(load_assets(store, key)) as second:  # another session, same avatar
        [second.next_frame() for _ in range(20)]
    assert decodes[0] == 0


def test_a_speaking_frame_is_its_loop_frame_with_the_mouth_pasted_in(hot, decodes, monkeypatch):
    """Each speaking frame against the whole-frame path: the stored frame in RGB, the
    renderer's patch written over its box, converted to I420 whole. The pixels the
    mouth changed (and their chroma blocks) equal that conversion's, byte for byte;
    every other byte is the stored frame's (the whole-frame round trip would have moved
    them by its rounding, up to 7 levels here)."""
    store, key = hot
    assets = load_assets(store, key)
    pcm = np.clip(speech(1.2, 48000) * 32767, -32768, 32767).astype("<i2").tobytes()
    with Conversation(assets) as conv:
        made: list = []  # the patches of the frame being rendered
        render_patches = conv.renderer.render_patches

        def recorded(ts, idxs, frames):
            made.extend(got := render_patches(ts, idxs, frames))
            return got

        monkeypatch.setattr(conv.renderer, "render_patches", recorded)
        conv.push_speech(pcm, 48000, 1)
        conv.end_of_turn()
        shown, patches = [], {}
        for t in range(40):
            made.clear()
            shown.append(conv.next_frame())
            patches[t] = made[0] if made else None
    drawn = 0
    for t, f in enumerate(shown):
        base = stored(assets, frame_index(t, N))
        rgb = to_rgb(frame_from_planes(*base))
        h, w = rgb.shape[:2]
        changed = np.zeros((h, w), bool)
        if patches[t] is not None:
            x1, y1, x2, y2 = patches[t].box
            changed[y1:y2, x1:x2] = np.any(rgb[y1:y2, x1:x2] != patches[t].pixels, axis=2)
            rgb[y1:y2, x1:x2] = patches[t].pixels
        drawn += changed.any()
        packed = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)  # the whole frame, as before
        whole = [packed[:h], *packed[h:].reshape(2, h // 2, w // 2)]
        blocks = changed.reshape(h // 2, 2, w // 2, 2).any(axis=(1, 3))
        for got, before, want, where in zip(
            i420(f.video), base, whole, (changed, blocks, blocks), strict=True
        ):
            # the mouth's pixels (and the chroma of their 2x2 blocks) as the whole-frame
            # conversion makes them; every other byte the stored frame's
            np.testing.assert_array_equal(got[where], want[where], err_msg=f"frame {t}")
            np.testing.assert_array_equal(got[~where], before[~where], err_msg=f"frame {t}")
    assert drawn >= 10  # the mouth moved on most of the turn's frames
    for i in range(N):  # the shared planes are still the stored frames
        got = loop_frames.shared().get(assets.load_frame.frame_key(i), lambda: None, 1.0)
        for a, b in zip(i420(got[0]), stored(assets, i), strict=True):
            np.testing.assert_array_equal(a, b)


def small_frame(value: int):
    y = np.full((4, 4), value, np.uint8)
    return frame_from_planes(y, y[:2, :2], y[:2, :2])


def test_the_budget_keeps_frames_in_use_and_lets_stale_ones_go():
    now = [0.0]
    cache = LoopFrames(budget=2 * 24, clock=lambda: now[0])  # two 4x4 frames
    assert cache.get("a", lambda: small_frame(1), 1.0)[1] is False
    assert cache.get("b", lambda: small_frame(2), 1.0)[1] is False
    # full of frames in use: the third is its caller's own, nothing evicted
    frame, owned = cache.get("c", lambda: small_frame(3), 1.0)
    assert owned and len(cache) == 2 and planes(frame)[0][0, 0] == 3
    got, owned = cache.get("a", lambda: pytest.fail("decoded again"), 1.0)
    assert not owned and planes(got)[0][0, 0] == 1
    now[0] = 3.5  # b unused past twice its period and a second: stale
    cache.get("a", lambda: pytest.fail("decoded again"), 1.0)
    assert cache.get("c", lambda: small_frame(3), 1.0)[1] is False
    assert cache.get("b", lambda: small_frame(2), 1.0)[1] is True  # b went, c is in use
    assert (cache.decoded, cache.used) == (5, 48)


def test_the_budget_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(loop_frames.BUDGET_ENV, raising=False)
    assert loop_frames.budget_from_env() == loop_frames.DEFAULT_BUDGET
    monkeypatch.setenv(loop_frames.BUDGET_ENV, "1G")
    assert loop_frames.budget_from_env() == 1 << 30
    monkeypatch.setenv(loop_frames.BUDGET_ENV, "0")  # keep nothing: every frame decoded
    assert loop_frames.budget_from_env() == 0
    monkeypatch.setenv(loop_frames.BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match=f"^{loop_frames.BUDGET_ENV}: 'lots' is not a size"):
        loop_frames.budget_from_env()
