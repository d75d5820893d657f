"""hotplate as the face of a Pipecat voice agent (the `[pipecat]` extra).

    from hotplate.integrations.pipecat import HotplateVideoService

    avatar = HotplateVideoService("ada", "studio", personas="~/personas", cache="~/hotplate")
    pipeline = Pipeline([transport.input(), stt, context.user(), llm, tts, avatar,
                         transport.output(), context.assistant()])

The service takes the TTS audio frames (`TTSAudioRawFrame`), and emits in their place
the avatar's frames at its loop's rate, always: `OutputImageRawFrame` (RGB, the stored
loop's size: `avatar.prepare()` gives it, for the transport's `video_out_width` and
`video_out_height`) and,
while it speaks, the same audio again as `TTSAudioRawFrame`, each picture after the
audio it goes with (`sync_with_audio`: the transport shows it once that audio is out).
Between turns the loop plays on with the mouth at rest, and no audio. The mouth is
rendered in process by hotplate's live renderer (`pipeline/render/conversation.py`)
from the store alone; the avatar is made hot by `prepare()` or when the pipeline starts
(`setup`), just in time if it is not, and leased until it stops.

`TTSStoppedFrame` is held until the turn's audio has played out, so the transport's
"bot stopped speaking" comes when the mouth closes, not when the TTS finished sending.
An `InterruptionFrame` drops the speech still queued: the next frame rests and is
silent, and the transport drops what it buffered.

Settings (store, personas folder, renderer, models) are read as the CLI reads them
(`hotplate.toml`, HOTPLATE_* variables); the arguments override them.

Supported: Pipecat 1.8 to 1.x (the `FrameProcessorSetup` sample rates arrived in
1.8.0); tests/hotplate/test_pipecat.py passes on 1.8.0 and 1.14.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from contextlib import ExitStack
from pathlib import Path

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputImageRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor, FrameProcessorSetup

RESYNC_FRAMES = 5  # frames behind the clock past which pacing restarts from now
END_WAIT = 120.0  # s an EndFrame waits for the speech queued to play out


class HotplateVideoService(FrameProcessor):
    """A hot avatar that says the TTS audio (module doc). `persona`, `attire`, `motion`:
    names in the personas folder, as `hotplate lip-sync` takes them. `personas`,
    `cache`, `renderer`, `config`: as the CLI's flags (None: the settings' own)."""

    def __init__(
        self,
        persona: str,
        attire: str = "default",
        *,
        motion: str | None = None,
        personas: str | Path | None = None,
        cache: str | Path | None = None,
        renderer: str | None = None,
        config: str | Path | None = None,
        **kwargs,
    ) -> None:
        from hotplate.settings import load_settings

        super().__init__(**kwargs)
        self._settings = load_settings(
            Path(config) if config else None, personas=personas, cache=cache, renderer=renderer
        )
        self._names = (persona, attire, motion)
        self._leases = ExitStack()
        self._conv = None
        self._hot = None  # (the hot avatar, its assets) once prepared
        self._player: asyncio.Task | None = None
        self._held_stop: TTSStoppedFrame | None = None
        self.avatar: str | None = None  # the avatar's key, once set up
        self.size: tuple[int, int] | None = None  # (width, height) of the pictures, once set up
        self.fps: float | None = None  # pictures a second, once set up
        self.frames = 0  # frames emitted
        self.speaking_frames = 0  # of which carried speech
        self.speaking = False  # the last frame emitted carried speech

    def prepare(self) -> tuple[int, int]:
        """Make the avatar hot (just in time if it is not: that takes a while) and lease
        it until the pipeline ends; (width, height) of its pictures, for the transport's
        `video_out_width`/`video_out_height`. `setup` calls it when no one has."""
        from cachestore.store import open_store
        from pipeline.lip_sync import LipSyncRequest, hot_avatar

        if self._hot is not None:
            return self.size
        s = self._settings
        persona, attire, motion = self._names
        store = open_store(s.cache, map_size=s.map_size)
        request = LipSyncRequest(
            persona, attire, Path(os.devnull), Path(os.devnull), motion, backend=s.renderer
        )
        steps = hot_avatar(store, s.personas, s.recipe, request, lambda *_: None, s.flight_wait)
        hot = self._leases.enter_context(steps)
        self._hot, self.avatar = (hot, hot.assets(store)), hot.avatar
        assets = self._hot[1]
        self.size = (assets.width - assets.width % 2, assets.height - assets.height % 2)
        return self.size

    async def setup(self, setup: FrameProcessorSetup) -> None:
        from pipeline.render.conversation import Conversation

        await super().setup(setup)
        try:
            await asyncio.to_thread(self.prepare)
            (hot, assets), s = self._hot, self._settings
            self._conv = await asyncio.to_thread(
                Conversation,
                assets,
                backend=s.renderer,
                fps=hot.options.get("fps"),
                audio_rate=setup.audio_out_sample_rate,
                loop=hot.options.get("loop") or s.loop,
                models_dir=hot.recipe.models_dir,
                vae=hot.recipe.vae or None,
            )
        except BaseException:
            self._leases.close()
            raise
        self.size, self.fps = (self._conv.width, self._conv.height), self._conv.fps

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if self._conv is None and isinstance(frame, (TTSAudioRawFrame, TTSStoppedFrame)):
            return  # after the end: nothing says it
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            self._player = self.create_task(self._play())
        elif isinstance(frame, TTSAudioRawFrame):  # said by the avatar, in its frames
            self._conv.push_speech(frame.audio, frame.sample_rate, frame.num_channels)
        elif isinstance(frame, TTSStoppedFrame):
            self._conv.end_of_turn()
            self._held_stop = frame  # pushed when the turn has played out (_play)
        elif isinstance(frame, InterruptionFrame):
            if self._conv is not None:
                self._conv.interrupt()
            self._held_stop = None
            await self.push_frame(frame, direction)
        elif isinstance(frame, EndFrame):
            await self._play_out()
            await self._stop()
            await self.push_frame(frame, direction)
        elif isinstance(frame, CancelFrame):
            await self._stop()
            await self.push_frame(frame, direction)
        else:
            await self.push_frame(frame, direction)

    async def _play(self) -> None:
        """The avatar's frames at its rate, for as long as the pipeline runs."""
        conv = self._conv
        rate = conv.audio_rate
        start, n = time.monotonic(), 0
        while True:
            frame = await asyncio.to_thread(conv.next_frame)
            self.speaking = frame.speaking
            if frame.speaking:
                await self.push_frame(TTSAudioRawFrame(frame.audio.tobytes(), rate, 1))
                self.speaking_frames += 1
            elif self._held_stop is not None and conv.queued_seconds() == 0:
                stop, self._held_stop = self._held_stop, None
                await self.push_frame(stop)
            image = OutputImageRawFrame(frame.to_rgb().tobytes(), self.size, "RGB")
            image.sync_with_audio = True  # shown once the audio before it is out
            await self.push_frame(image)
            self.frames += 1
            n += 1
            wait = start + n / conv.fps - time.monotonic()
            if wait < -RESYNC_FRAMES / conv.fps:  # fell behind (a slow machine): no burst
                start, n = time.monotonic(), 0
            elif wait > 0:
                await asyncio.sleep(wait)

    async def _play_out(self) -> None:
        """Until the speech queued has been said (an EndFrame ends after the reply)."""
        deadline = time.monotonic() + END_WAIT
        while (
            self._player is not None
            and not self._player.done()
            and (self._conv.queued_seconds() > 0 or self._held_stop is not None)
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(1 / self._conv.fps)

    async def _stop(self) -> None:
        if self._player is not None:
            await self.cancel_task(self._player)
            self._player = None
        if self._conv is not None:
            # the pipeline is ending: a failure to close must not hide why it ended
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._conv.close)
            self._conv = None
        self._leases.close()
        self._hot = None

    async def cleanup(self) -> None:
        await super().cleanup()
        await self._stop()
