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


def test_an_interrupt_silences_the_sound_rendered_and_not_yet_sent():
    assets = build_assets(6)

    async def run() -> tuple[list, list[int], int, int]:
        with Conversation(assets) as conv:
            step = int(round(rtc.VIDEO_CLOCK / conv.fps))  # a frame, in the pictures' clock
            pump = rtc.FramePump(conv, asyncio.get_running_loop())
            video, audio = rtc.video_track(pump), rtc.audio_track(pump)
            pcm = np.clip(speech(4.0, 48000) * 32767, -32768, 32767).astype("<i2")
            conv.push_speech(pcm.tobytes(), 48000, 1)
            conv.end_of_turn()
            stamps: list[int] = []

            async def pictures() -> None:
                while True:
                    stamps.append((await video.recv()).pts)

            reader = asyncio.create_task(pictures())
            pump.start()
            try:
                loud, after = 0, []
                while loud < 5:  # speech is playing
                    piece = (await asyncio.wait_for(audio.recv(), 10)).to_ndarray()[0]
                    loud += int(np.abs(piece).max() > LOUD)
                pump.interrupt()
                cut_at = len(stamps)
                for _ in range(10):  # 200 ms: what was queued, then the frames after
                    after.append((await asyncio.wait_for(audio.recv(), 10)).to_ndarray()[0])
                return after, stamps, cut_at, step
            finally:
                reader.cancel()
                await asyncio.to_thread(pump.stop)

    after, stamps, cut_at, step = asyncio.run(run())
    fade = int(rtc.FADE_OUT * rtc.AUDIO_RATE)
    # the first piece sent after the interrupt fades out over 5 ms; all after are silent
    assert not after[0][fade:].any(), np.abs(after[0]).max()
    assert all(not piece.any() for piece in after[1:]), [np.abs(p).max() for p in after]
    # the pictures' times only go forward, on the clock's frame grid but for the picture
    # an interrupt rendered at once: stamped just after the one before it, in its place
    # (none where the interrupt found the pump behind its clock, rendering on the grid)
    assert len(stamps) > cut_at + 2 and (np.diff(stamps) > 0).all(), stamps
    off_grid = [k for k, s in enumerate(stamps) if s % step]
    assert len(off_grid) <= 1, stamps
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
