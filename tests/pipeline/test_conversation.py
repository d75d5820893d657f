"""The conversation engine (pipeline/render/conversation.py) with the real warp renderer
on the testkit's avatars: the loop plays on between turns, speech is delayed by the
lookahead and no more, an interrupt silences the next frame, a switch waits for the
loop point."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipeline.render.conversation import Conversation
from pipeline.render.schedule import frame_index
from pipeline.yuv import frame_from_rgb, planes
from testkit.render_fixtures import build_assets, speech, tiny_musetalk_avatar

N = 6  # stored frames: a ping-pong period of 10


@pytest.fixture(scope="module")
def assets():
    return build_assets(N)


def pcm(seconds: float, rate: int, channels: int = 1, seed: int = 0) -> bytes:
    mono = np.clip(speech(seconds, rate, seed) * 32767, -32768, 32767).astype("<i2")
    return np.repeat(mono[:, None], channels, axis=1).tobytes()


def luma(frame) -> np.ndarray:
    return planes(frame)[0].copy()


def stored_luma(assets, i: int) -> np.ndarray:
    return luma(frame_from_rgb(assets.load_frame(i)))


def test_between_turns_the_loop_plays_on_with_the_mouth_at_rest(assets):
    with Conversation(assets) as conv:
        assert (conv.fps, conv.samples_per_frame, conv.audio_rate) == (25.0, 1920, 48000)
        assert (conv.width, conv.height) == (assets.width, assets.height)
        frames = [conv.next_frame() for _ in range(25)]
    for t, f in enumerate(frames):
        assert f.index == t and not f.speaking and f.speech_onset is None
        assert f.audio.dtype == np.int16 and f.audio.shape == (1920,) and not f.audio.any()
        # the stored frame as it is: no mouth drawn over it
        assert np.array_equal(luma(f.video), stored_luma(assets, frame_index(t, N)))
        assert f.to_rgb().shape == (assets.height, assets.width, 3)
    # the loop moves (breathing, sway): consecutive frames differ
    assert all(
        not np.array_equal(luma(a.video), luma(b.video))
        for a, b in zip(frames[:4], frames[1:5], strict=True)
    )


def test_a_turn_plays_its_speech_whole_and_the_mouth_moves_with_it(assets):
    data = pcm(2.0, 16000, channels=2)
    with Conversation(assets) as conv:
        idle = [conv.next_frame() for _ in range(3)]
        pushed = time.monotonic()
        for at in range(0, len(data), 1234):  # chunks that split samples
            conv.push_speech(data[at : at + 1234], 16000, 2)
        conv.end_of_turn()
        frames = [conv.next_frame() for _ in range(70)]
    talk = [f for f in frames if f.speaking]
    # every frame of the turn, then the loop at rest again: no frame skipped or repeated
    assert [f.index for f in frames] == list(range(3, 73)) and idle[-1].index == 2
    assert len(talk) == 50 and all(f.speaking for f in frames[:50])
    assert not any(f.speaking or f.audio.any() for f in frames[50:])
    assert all(f.speech_onset is not None and f.speech_onset >= pushed for f in talk)
    # the audio out is the speech in, at 48 kHz mono (resampled: compare loudness per frame)
    sent = speech(2.0, 48000)
    got = np.concatenate([f.audio for f in talk]).astype(np.float32) / 32767
    rms_in = np.sqrt(np.mean(sent.reshape(50, -1) ** 2, axis=1))
    rms_out = np.sqrt(np.mean(got.reshape(50, -1) ** 2, axis=1))
    assert np.corrcoef(rms_in, rms_out)[0, 1] > 0.99
    # the mouth opens on loud frames, and the pixels of those frames are not the stored ones
    openings = np.array([f.opening for f in talk])
    assert np.corrcoef(openings, rms_out)[0, 1] > 0.5 and openings.max() > 0.5
    opened = [f for f in talk if f.opening > 0.3]
    assert opened and all(
        not np.array_equal(luma(f.video), stored_luma(assets, frame_index(f.index, N)))
        for f in opened
    )
    # after the turn the mouth is back at rest: the stored frames again
    for f in frames[55:]:
        assert f.opening == 0.0
        assert np.array_equal(luma(f.video), stored_luma(assets, frame_index(f.index, N)))


def test_speech_waits_for_the_lookahead_and_no_more(assets):
    one = pcm(0.04, 48000)  # exactly one frame of audio
    with Conversation(assets) as conv:
        assert conv.look == 1  # warp
        conv.next_frame()
        conv.push_speech(one, 48000, 1)
        assert not conv.next_frame().speaking  # its lookahead (the next frame) is not in
        conv.push_speech(pcm(0.04, 48000, seed=1), 48000, 1)
        first = conv.next_frame()
        assert first.speaking  # the frame goes as soon as the one after it is in
        assert np.array_equal(first.audio, np.frombuffer(one, "<i2"))  # same rate: bytes
        # a queue that runs dry mid-turn plays silence, then waits for the lookahead again
        assert conv.next_frame().speaking  # the second frame: the run goes on
        assert not conv.next_frame().speaking
        conv.push_speech(one, 48000, 1)
        conv.end_of_turn()  # nothing follows: no lookahead to wait for
        assert conv.next_frame().speaking and not conv.next_frame().speaking


def test_an_interrupt_closes_the_mouth_and_silences_the_next_frame(assets):
    with Conversation(assets) as conv:
        conv.push_speech(pcm(3.0, 24000), 24000, 1)
        conv.end_of_turn()
        talk = [conv.next_frame() for _ in range(30)]
        assert all(f.speaking for f in talk) and max(f.opening for f in talk) > 0.5
        conv.interrupt()
        after = [conv.next_frame() for _ in range(10)]
        # the next speech starts from a mouth at rest
        conv.push_speech(pcm(1.0, 24000, seed=2), 24000, 1)
        conv.end_of_turn()
        again = [conv.next_frame() for _ in range(30)]
    for f in after:
        assert not f.speaking and not f.audio.any() and f.opening == 0.0
        assert np.array_equal(luma(f.video), stored_luma(assets, frame_index(f.index, N)))
    assert sum(f.speaking for f in again) == 25 and max(f.opening for f in again) > 0.5


def test_a_switch_takes_effect_at_the_next_loop_point(assets):
    other = build_assets(N, seed=3)  # another motion of the same size
    with Conversation(assets) as conv:
        before = [conv.next_frame() for _ in range(13)]
        conv.switch(other)
        later = [conv.next_frame() for _ in range(25)]
        with pytest.raises(ValueError, match="360x640"):
            conv.switch(build_assets(N, size=(320, 480)))
    assert [f.index for f in before + later] == list(range(38))
    frames = before + later
    # frames fetched before the switch (up to FETCH_AHEAD) and the rest of that loop
    # play the old loop; the next loop point (t = 20, period 10) starts the new one
    # from its first frame, the switch made at t = 13 being past t = 10's point
    for f in frames[:20]:
        assert np.array_equal(luma(f.video), stored_luma(assets, frame_index(f.index, N)))
    for f in frames[20:]:
        assert np.array_equal(luma(f.video), stored_luma(other, frame_index(f.index - 20, N)))


def test_a_closed_conversation_says_so(assets):
    conv = Conversation(assets)
    conv.next_frame()
    conv.close()
    with pytest.raises(RuntimeError, match="closed"):
        conv.next_frame()


def test_musetalk_rests_from_the_first_frame_and_right_after_an_interrupt(tmp_path_factory):
    """musetalk (tiny random weights) rests only after a long enough pause (its silence
    weight): the conversation's history starts as silence, and an interrupt makes it
    silence again, so the first frames and those right after an interrupt are the loop
    at rest, as after a long pause (a short history had it draw its random mouth over
    the first five frames)."""
    models, avatar = tiny_musetalk_avatar(tmp_path_factory.mktemp("models"))
    with Conversation(avatar, backend="musetalk", models_dir=models) as conv:
        assert conv.look == 2
        idle = [conv.next_frame() for _ in range(6)]
        conv.push_speech(pcm(1.0, 16000), 16000, 1)
        conv.end_of_turn()
        turn = [conv.next_frame() for _ in range(28)]
        after = [conv.next_frame() for _ in range(20)]
        conv.push_speech(pcm(3.0, 16000, seed=1), 16000, 1)
        conv.end_of_turn()
        cut = [conv.next_frame() for _ in range(8)]
        conv.interrupt()
        rest = [conv.next_frame() for _ in range(3)]
    # the loop at rest: each stored frame as the last 10 frames of a long pause show it
    at_rest = {frame_index(f.index, 4): luma(f.video) for f in after[-10:]}
    assert len(at_rest) == 4

    def resting(f) -> bool:
        return np.array_equal(luma(f.video), at_rest[frame_index(f.index, 4)])

    assert all(resting(f) for f in idle + rest)
    assert sum(not resting(f) for f in turn) >= 20 and not any(resting(f) for f in cut[3:])


def test_a_refused_piece_of_speech_leaves_no_onset_and_keeps_the_turn_ended():
    """A piece past the queue is refused whole: it stamped its arrival as a speech onset
    before the size check (a stale time for the next speech at that point) and reopened
    an ended turn, so the queued speech no longer played out to its last sample."""
    from pipeline.render.conversation import _Speech

    queue = _Speech(48000, 16000, max_queue=1.0)
    queue.push(pcm(0.5, 16000), 16000, 1, now=1.0)
    queue.flush()
    queue.ended = True  # what end_of_turn sets
    queued = queue.out.size
    with pytest.raises(ValueError, match="over 1 s of speech queued"):
        queue.push(pcm(2.0, 16000), 16000, 1, now=2.0)
    assert [t for _, t in queue.onsets] == [1.0]
    assert queue.ended and queue.out.size == queued
