"""The session's clock (hotplate/serve/rtc.py's FramePump) and aiortc's tracks it feeds,
on a real Conversation with the warp renderer: an interrupt silences the sound already
rendered and not yet sent, and its picture is stamped just after the one before it; a
burst of interrupts does not run the clock ahead."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from hotplate.serve import rtc
from pipeline.render.conversation import Conversation
from testkit.render_fixtures import build_assets, speech

LOUD = 1000  # int16 peak: speech, not the fade's tail or silence
ATTEMPTS = 10  # interrupts tried until one finds the pump waiting for its clock


def test_an_interrupt_silences_the_sound_rendered_and_not_yet_sent(monkeypatch):
    """Interrupted just after the first 20 ms of a frame's sound was sent, while speech
    is loud: the frame's second 20 ms, rendered before the interrupt, fades out over
    FADE_OUT from the speech and is silent after it, and all after it is silent; the
    frame the interrupt renders at once is stamped CUT_STAMP after the picture before it.
    The pump renders at once only when it is waiting for its clock (not behind it on a
    busy machine): the interrupt is tried again, on new speech, until it did. Every
    picture is read (the pictures' queue is not bounded here: a reader the machine
    starves drops none), so each one the interrupt rendered is seen."""
    monkeypatch.setattr(rtc, "VIDEO_QUEUE", 1 << 20)
    assets = build_assets(6)

    async def run() -> tuple[list, list, list[int], int, int]:
        with Conversation(assets) as conv:
            step = int(round(rtc.VIDEO_CLOCK / conv.fps))  # a frame, in the pictures' clock
            spf = conv.samples_per_frame
            pump = rtc.FramePump(conv, asyncio.get_running_loop())
            video, audio = rtc.video_track(pump), rtc.audio_track(pump)
            stamps: list[int] = []

            async def pictures() -> None:  # every picture, to the pump's stop (None)
                while (picture := await video.recv()) is not None:
                    stamps.append(picture.pts)

            reader = asyncio.create_task(pictures())
            pump.start()
            cuts = []  # (the last piece sent before each interrupt, the 10 pieces after)
            try:
                for seed in range(ATTEMPTS):
                    pcm = np.clip(speech(4.0, 48000, seed) * 32767, -32768, 32767)
                    conv.push_speech(pcm.astype("<i2").tobytes(), 48000, 1)
                    conv.end_of_turn()
                    loud = 0
                    while True:  # speech is playing, loud to the end of a frame's first half
                        frame = await asyncio.wait_for(audio.recv(), 10)
                        piece = frame.to_ndarray()[0]
                        loud += int(np.abs(piece).max() > LOUD)
                        tail = np.abs(piece[-48:]).max() > LOUD  # its last 1 ms
                        if loud >= 5 and tail and frame.pts % spf == 0:
                            break
                    pump.interrupt()
                    after = [(await asyncio.wait_for(audio.recv(), 10)).to_ndarray()[0]]
                    for _ in range(9):  # 200 ms: what was queued, then the frames after
                        after.append((await asyncio.wait_for(audio.recv(), 10)).to_ndarray()[0])
                    cuts.append((piece, after))
                    if pump.stats.cuts:
                        break
            finally:
                await asyncio.to_thread(pump.stop)
                pump.video.put_nowait(None)
                await asyncio.wait_for(reader, 10)
            assert len(stamps) == pump.stats.frames, (len(stamps), pump.stats)
            return cuts, stamps, pump.stats.cuts, step

    cuts, stamps, rendered_at_once, step = asyncio.run(run())
    fade = int(rtc.FADE_OUT * rtc.AUDIO_RATE)
    ramp = np.linspace(1.0, 0.0, fade, endpoint=False)
    for _, after in cuts:
        # the frame's second half was rendered before the interrupt: it fades out from
        # the speech (not silence, not cut) to zero over FADE_OUT, and is silent after it
        head = np.abs(after[0][:fade].astype(np.int64))
        assert np.count_nonzero(head) > fade // 2, head
        assert (head <= ramp * 32768 + 1).all(), head
        assert not after[0][fade:].any(), np.abs(after[0][fade:]).max()
        assert all(not piece.any() for piece in after[1:]), [np.abs(p).max() for p in after]
    # the pictures' times only go forward, on the clock's frame grid but for each picture
    # an interrupt rendered at once: stamped CUT_STAMP after the one before it
    assert rendered_at_once >= 1, f"the pump was behind its clock at all {ATTEMPTS} tries"
    assert (np.diff(stamps) > 0).all(), stamps
    off_grid = [k for k, s in enumerate(stamps) if s % step]
    assert len(off_grid) == rendered_at_once, (rendered_at_once, stamps)
    for k in off_grid:
        assert stamps[k] - stamps[k - 1] == round(rtc.CUT_STAMP * rtc.VIDEO_CLOCK), stamps


def test_a_burst_of_interrupts_keeps_the_pump_on_its_clock():
    """A client that interrupts on every microphone chunk (here 100 a second for 1 s):
    the pump renders one frame ahead of its clock at most, so it neither races through
    frames during the burst nor freezes after it."""
    assets = build_assets(6)

    async def run() -> tuple[float, int, int]:
        with Conversation(assets) as conv:
            pump = rtc.FramePump(conv, asyncio.get_running_loop())
            video = rtc.video_track(pump)
            pictures = 0

            async def read() -> None:
                nonlocal pictures
                while True:
                    await video.recv()
                    pictures += 1

            reader = asyncio.create_task(read())
            started = time.monotonic()  # before the pump's own start: a looser bound
            pump.start()
            try:
                for _ in range(100):
                    pump.interrupt()
                    await asyncio.sleep(0.01)
                elapsed, frames = time.monotonic() - started, pump.stats.frames
                after = pictures
                while pictures < after + 5:  # and pictures go on coming after it
                    await asyncio.sleep(0.01)
                return elapsed * conv.fps, frames, pictures - after
            finally:
                reader.cancel()
                await asyncio.to_thread(pump.stop)

    clock_frames, frames, more = asyncio.run(asyncio.wait_for(run(), 60))
    # frame t is rendered from its due time on, or one frame sooner at an interrupt
    assert frames <= clock_frames + 2, (frames, clock_frames)
    assert more >= 5
