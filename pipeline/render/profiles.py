"""Encoder profiles: the x264 settings a render encodes with, by name.

Two, a product decision (issue 32): `preview` for what an editor watches while it is
made (the streaming routes and the page), `export` for the file that is delivered
(whole-file renders, the CLI, `POST /v1/lip-sync`). A profile is the whole encoder
setting, keyframes included: a stream's fragments each start on a keyframe
(render/fmp4.py), and a file of the same profile has its keyframes in the same places
(where its fragments would start), so a stream and a file of one profile carry the
same coded pictures; only the container differs.

The figures behind the choice are bench/bench_hot_path.py's encoder table (ms per
1080x1920 frame, PSNR against the source and against the export, Mbit/s); see
docs/notebook/hot-path.md, "Two encoder profiles".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

RAMP = (1, 2, 4, 8)  # frames in the first fragments: the first one leaves at once


def fragment_starts(per: int, ramp: tuple[int, ...] = RAMP) -> Iterator[int]:
    """First frame of each fragment: the ramp's (capped at `per`), then every `per`."""
    t = 0
    for n in ramp:
        if n >= per:
            break
        yield t
        t += n
    while True:
        yield t
        t += per


def fragment_frames(fps: float | Fraction, seconds: float) -> int:
    """Frames per fragment: as many as fit in `seconds` (at least one)."""
    return max(1, int(float(seconds) * float(fps) + 1e-9))


@dataclass(frozen=True)
class EncoderProfile:
    name: str
    preset: str
    crf: int
    tune: str | None = None  # "zerolatency": no B-frames or lookahead, packets at once
    # a stream's fragments last this long (after the RAMP), each from a keyframe; a file
    # has its keyframes at the same frames
    fragment_seconds: float = 0.5
    summary: str = ""

    def fragment_frames(self, fps: float | Fraction) -> int:
        return fragment_frames(fps, self.fragment_seconds)

    def x264_options(self, fps: float | Fraction) -> dict[str, str]:
        """The libx264 options of this profile (PyAV's `stream.options`) at `fps`: x264
        places no keyframe of its own (the writer forces them, `keyframes`)."""
        options = {"preset": self.preset, "crf": str(self.crf)}
        if self.tune:
            options["tune"] = self.tune
        per = self.fragment_frames(fps)
        options["x264-params"] = f"keyint={per}:min-keyint={per}:scenecut=0"
        return options

    def keyframes(self, fps: float | Fraction) -> Iterator[int]:
        """The frames that are keyframes, in order: each fragment's first."""
        return fragment_starts(self.fragment_frames(fps))


PROFILES = {
    # ultrafast + zerolatency at CRF 23: ~9 ms of CPU a 1080x1920 frame against
    # superfast's ~25, each packet out as its frame goes in; 0.5 s fragments
    "preview": EncoderProfile(
        "preview",
        preset="ultrafast",
        crf=23,
        tune="zerolatency",
        fragment_seconds=0.5,
        summary="fast, for watching while it renders (ultrafast, zerolatency, CRF 23)",
    ),
    # what files always had, superfast at CRF 18 (visually lossless for presenter
    # video), a keyframe every 10 s (x264's own default interval)
    "export": EncoderProfile(
        "export",
        preset="superfast",
        crf=18,
        fragment_seconds=10.0,
        summary="the delivered file's quality (superfast, CRF 18)",
    ),
}
FILE_PROFILE = "export"  # whole-file renders: the CLI, POST /v1/lip-sync, the watcher
STREAM_PROFILE = "preview"  # POST /v1/lip-sync/stream, WS /v1/live, the page


def get_profile(profile: str | EncoderProfile) -> EncoderProfile:
    """The profile named `profile`; ValueError naming the choices for an unknown one."""
    if isinstance(profile, EncoderProfile):
        return profile
    found = PROFILES.get(profile) if isinstance(profile, str) else None
    if found is None:
        raise ValueError(f"profile {profile!r} is not one of {', '.join(PROFILES)}")
    return found
