"""The encoders a session's peer connection sends with (rtc.py), and what each costs.

Which video codec: the server's choice among those the offer allows, the first of
VIDEO_CODECS (`prefer`): H.264 where the offer carries it (Chromium's does), VP8
otherwise. Each is set for real time and runs one thread (a session's encode is then
one core's work at most, and N sessions on N cores do not fight over threads):
- H.264: x264 (through PyAV, as aiortc's own H.264 encoder), X264_PRESET with the
  zerolatency tune (no lookahead, no B-frames), constrained baseline, the level the frame
  size needs, one reference frame; X264_CRF's quality capped at the bitrate (VBV, a 1 s
  buffer), never coarser than X264_QP_MAX. Encoded alone (2026-12-07, 50-frame loops, 1.5 Mbit/s, one thread): 540x960
  3.2 ms a frame at 44.8 dB against VP8's 6.3 ms at 42.1; 1080x1920 10 ms at 42.2 dB
  against 17.3 at 42.9. superfast, not ultrafast: ultrafast's 2.3 ms came at 38.9 dB.
  More references (ref=8) made the mouth 4 dB sharper on an 8-frame loop, whose frame
  eight back is the same picture, but cost 45% more at 540x960 on a 50-frame loop for
  nothing: a loop is longer than any reference list;
- VP8: aiortc's libvpx settings (realtime deadline, cpu-used -6, no lag), one thread.
Both start at START_BITRATE and follow the receiver's estimate (REMB) up to the profile's
ceiling (rtc.MAX_BITRATE), the same for both (aiortc started H.264 at 1 Mbit/s).

aiortc makes a sender's encoder when its first frame comes, with `get_encoder(codec)`;
`install()` puts `encoder_for` in its place, which gives the same encoders with a meter:
the CPU seconds of each frame's encode and, apart from it, of cutting the frame into RTP
payloads (packetise), read with `time.thread_time()` on the thread aiortc encodes on
(an executor thread; each encoder here runs one thread of its own, so that thread's
time is all of it). A session's figures (talk.py) split its CPU per frame by these.
"""

from __future__ import annotations

import os
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


# the server's preference, the first the offer allows; HOTPLATE_SESSION_VIDEO_CODECS
# (names, comma-separated) sets another, e.g. VP8 alone to measure it
VIDEO_CODECS = tuple(
    name.strip()
    for name in os.environ.get("HOTPLATE_SESSION_VIDEO_CODECS", "H264,VP8").split(",")
    if name.strip()
)
X264_PRESET = "superfast"
X264_CRF = 18  # the quality x264 aims at, under the bitrate cap
# the coarsest quantiser x264 may use, over the cap if need be, as libvpx's qmax (56) makes
# VP8 do: at 1080x1920 and 500 kbit/s VP8 sent 860 kbit/s at 38.6 dB, and x264 held to
# 490 at 27.1; with this, 790 at 39.1 (2026-12-07, encoded alone)
X264_QP_MAX = 34
START_BITRATE = 500_000  # bit/s before the receiver's first estimate (aiortc's VP8 start)
# H.264 levels by the most macroblocks a frame may have (the SPS says the stream's level)
H264_LEVELS = ((1620, "30"), (3600, "31"), (8192, "40"), (22080, "51"))


def prefer(codecs: list) -> list:
    """`codecs` (an answer's, aiortc's RTCRtpCodecParameters in the offer's order) with
    the first of VIDEO_CODECS among them first (those not named keep their place after
    the named ones: an offer of none of them is answered as it asks); each retransmission
    (rtx) codec follows the codec it repeats, as in the offer."""
    rank = {name.lower(): k for k, name in enumerate(VIDEO_CODECS)}
    media = [c for c in codecs if c.name.lower() != "rtx"]
    media.sort(key=lambda c: rank.get(c.name.lower(), len(rank)))  # stable: the offer's order
    out = []
    for codec in media:
        out.append(codec)
        out += [
            c
            for c in codecs
            if c.name.lower() == "rtx" and c.parameters.get("apt") == codec.payloadType
        ]
    return out


def h264_level(width: int, height: int) -> str:
    blocks = -(-width // 16) * -(-height // 16)
    return next((level for most, level in H264_LEVELS if blocks <= most), H264_LEVELS[-1][1])


def _classes() -> dict[str, type]:
    """mime type -> the metered encoder class (aiortc imported when a session starts)."""
    import fractions

    import av
    from aiortc.codecs import h264
    from aiortc.codecs.opus import OpusEncoder
    from aiortc.codecs.vpx import Vp8Encoder

    class MeteredVp8(Metered, Vp8Encoder):
        def __init__(self) -> None:
            super().__init__()
            self.target_bitrate = START_BITRATE

    class MeteredH264(Metered, h264.H264Encoder):
        def __init__(self) -> None:
            super().__init__()
            self.target_bitrate = START_BITRATE

        def _encode_frame(self, frame: Any, force_keyframe: bool) -> list[bytes]:
            """aiortc's, x264 set for real time (module doc); a list, not a generator,
            so that the encode is done before packetise is timed (Metered)."""
            c = self.codec
            if c is not None and (
                (frame.width, frame.height) != (c.width, c.height)
                or abs(self.target_bitrate - self.opened_at) / self.opened_at > 0.1
            ):
                c = self.codec = None
            frame.pict_type = (
                av.video.frame.PictureType.I if force_keyframe else av.video.frame.PictureType.NONE
            )
            if c is None:
                c = self.codec = av.CodecContext.create("libx264", "w")
                c.width, c.height = frame.width, frame.height
                c.pix_fmt = "yuv420p"
                c.framerate = fractions.Fraction(h264.MAX_FRAME_RATE, 1)
                # the pictures' own clock: aiortc's 1/30 s rounded an interrupt's picture,
                # stamped 2 ms after the one before it (rtc.CUT_STAMP), onto that one's
                # timestamp, and the player decoded garbage until the next keyframe (1 s)
                c.time_base = fractions.Fraction(1, 90000)
                c.max_b_frames = 0
                c.thread_count = 1
                c.qmax = X264_QP_MAX
                self.opened_at = rate = self.target_bitrate
                c.options = {
                    "preset": X264_PRESET,
                    "tune": "zerolatency",
                    "level": h264_level(frame.width, frame.height),
                    # the quality X264_CRF asks, capped at the bitrate (a 1 s buffer)
                    "crf": str(X264_CRF),
                    "maxrate": str(rate),
                    "bufsize": str(rate),
                }
                c.profile = "Baseline"  # constrained baseline: what every offer allows
            data = b"".join(bytes(p) for p in c.encode(frame))
            return list(self._split_bitstream(data)) if data else []

    class MeteredOpus(Metered, OpusEncoder):
        pass

    return {"video/vp8": MeteredVp8, "video/h264": MeteredH264, "audio/opus": MeteredOpus}


_CLASSES: dict[str, type] = {}


def encoder_for(codec: Any) -> Any:
    """aiortc's `get_encoder`, metered where this module knows the codec."""
    from aiortc.codecs import get_encoder

    if not _CLASSES:
        _CLASSES.update(_classes())
    cls = _CLASSES.get(codec.mimeType.lower())
    return cls() if cls is not None else get_encoder(codec)


def install() -> None:
    """Every sender aiortc makes from now on in this process encodes with `encoder_for`,
    VP8 on one thread (module doc)."""
    from aiortc import rtcrtpsender
    from aiortc.codecs import vpx

    rtcrtpsender.get_encoder = encoder_for
    vpx.number_of_threads = lambda pixels, cpus: 1


def sender_encoder(sender: Any) -> Any:
    """The encoder aiortc made for `sender` (None before its first frame). aiortc keeps
    it private (RTCRtpSender.__encoder; aiortc is pinned)."""
    return getattr(sender, "_RTCRtpSender__encoder", None)
