"""An offline voice for Pipecat: espeak-ng as a TTS service (robotic, but it needs no
network, no key and no model; `apt-get install espeak-ng`). For examples and tests of
the avatar service; a real agent uses a real TTS service in its place."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncGenerator

from pipecat.frames.frames import ErrorFrame, Frame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService

CHUNK = 4096  # bytes of espeak-ng's output read at a time


class EspeakTTSService(TTSService):
    """Speaks each text with `espeak-ng` (`voice` as its -v, `speed` words a minute)."""

    def __init__(self, *, voice: str = "en", speed: int = 150, **kwargs) -> None:
        settings = TTSSettings(model=None, voice=voice, language=None)
        super().__init__(push_start_frame=True, push_stop_frames=True, settings=settings, **kwargs)
        self._exe = shutil.which("espeak-ng")
        if self._exe is None:
            raise RuntimeError("espeak-ng is not installed: apt-get install espeak-ng")
        self._voice, self._speed = voice, speed

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame, None]:
        proc = await asyncio.create_subprocess_exec(
            self._exe, "-v", self._voice, "-s", str(self._speed), "--stdout", text,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

        async def chunks():
            while data := await proc.stdout.read(CHUNK):
                yield data

        try:
            async for frame in self._stream_audio_frames_from_iterator(
                chunks(), strip_wav_header=True, context_id=context_id
            ):
                await self.stop_ttfb_metrics()
                yield frame
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        if proc.returncode not in (0, -9):
            error = (await proc.stderr.read()).decode(errors="replace").strip()
            yield ErrorFrame(error=f"espeak-ng failed ({proc.returncode}): {error}")
