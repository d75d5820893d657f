"""The encoders a session's peer connection sends with (rtc.py), and what each costs.

aiortc makes a sender's encoder when its first frame comes, with `get_encoder(codec)`;
`install()` puts `encoder_for` in its place, which gives the same encoders with a meter:
the CPU seconds of each frame's encode and, apart from it, of cutting the frame into RTP
payloads (packetise), read with `time.thread_time()` on the thread aiortc encodes on
(an executor thread; each encoder here runs one thread of its own, so that thread's
time is all of it). A session's figures (talk.py) split its CPU per frame by these.
"""

from __future__ import annotations

import time
from typing import Any


class Metered:
    """A mixin for an aiortc encoder: `encode_seconds` and `packetise_seconds` (CPU, the
    encoding thread's) over `frames` frames encoded."""

    encode_seconds = 0.0
    packetise_seconds = 0.0
    frames = 0
    _packing = 0.0

    def encode(self, frame: Any, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        began = time.thread_time()
        self._packing = 0.0
        out = super().encode(frame, force_keyframe)
        took = time.thread_time() - began
        self.frames += 1
        self.packetise_seconds += self._packing
        self.encode_seconds += took - self._packing
        return out

    def _packetize(self, *args: Any) -> list[bytes]:
        began = time.thread_time()
        out = super()._packetize(*args)
        self._packing += time.thread_time() - began
        return out


def _classes() -> dict[str, type]:
    """mime type -> the metered encoder class (aiortc imported when a session starts)."""
    from aiortc.codecs.opus import OpusEncoder
    from aiortc.codecs.vpx import Vp8Encoder

    class MeteredVp8(Metered, Vp8Encoder):
        pass

    class MeteredOpus(Metered, OpusEncoder):
        pass

    return {"video/vp8": MeteredVp8, "audio/opus": MeteredOpus}


_CLASSES: dict[str, type] = {}


def encoder_for(codec: Any) -> Any:
    """aiortc's `get_encoder`, metered where this module knows the codec."""
    from aiortc.codecs import get_encoder

    if not _CLASSES:
        _CLASSES.update(_classes())
    cls = _CLASSES.get(codec.mimeType.lower())
    return cls() if cls is not None else get_encoder(codec)


def install() -> None:
    """Every sender aiortc makes from now on in this process encodes with `encoder_for`."""
    from aiortc import rtcrtpsender

    rtcrtpsender.get_encoder = encoder_for


def sender_encoder(sender: Any) -> Any:
    """The encoder aiortc made for `sender` (None before its first frame). aiortc keeps
    it private (RTCRtpSender.__encoder; aiortc is pinned)."""
    return getattr(sender, "_RTCRtpSender__encoder", None)
