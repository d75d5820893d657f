"""Checks an upload passes before it costs any work: its size, and that it is audio of
an acceptable length (checked here, in the server, so a bad file never reaches a worker)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from fastapi import UploadFile

from hotplate.serve.problems import Problem

AUDIO_SUFFIXES = (".wav", ".mp3", ".m4a", ".aac", ".flac", ".ogg", ".opus", ".webm")
CHUNK = 1 << 20


async def save_upload(upload: UploadFile, target_stem: Path, max_bytes: int) -> Path:
    """Write the upload to target_stem + its suffix; Problem 413 past max_bytes, 507 when
    the disk is full. Whatever fails, no partial file is left behind."""
    suffix = Path(upload.filename or "").suffix.lower()
    target = target_stem.with_suffix(suffix if suffix in AUDIO_SUFFIXES else ".audio")
    size = 0
    try:
        with open(target, "wb") as out:
            while chunk := await upload.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise Problem(
                        413,
                        f"audio upload is over the {max_bytes / 1e6:g} MB limit; send a "
                        "shorter or compressed clip",
                    )
                out.write(chunk)
    except OSError as exc:
        target.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise Problem(
                507, "the server's disk is full; retry later, or ask its operator to free space"
            ) from None
        raise
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


HEADER_SLACK = 1.1  # MP3 headers estimate the duration from a bitrate: allow 10% over


def check_audio(path: Path, name: str, max_seconds: float) -> float:
    """The clip's duration in seconds; Problem 415 (not decodable audio) or 422 (empty,
    too long).

    Never decodes more than `max_seconds` of audio, and holds one decoded frame at a time:
    a clip whose header claims more than the limit is refused on the claim; any other is
    decoded frame by frame, counting samples, and refused the moment the count passes the
    limit (a header may lie short). Memory does not grow with the file's claim or length.
    """
    import av

    undecodable = Problem(
        415, f"audio {name!r} is not decodable audio; send a WAV, MP3, M4A, FLAC or OGG file"
    )

    def too_long(seconds: str) -> Problem:
        return Problem(
            422,
            f"audio {name!r} lasts {seconds}, over the {max_seconds:g} s limit; "
            "split it into shorter clips",
        )

    seconds = 0.0
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise undecodable
            stream = container.streams.audio[0]
            claimed = header_seconds(container, stream)
            if claimed is not None and claimed > max_seconds * HEADER_SLACK:
                raise too_long(f"{claimed:.1f} s by its header")
            for frame in container.decode(stream):
                if frame.sample_rate:
                    seconds += frame.samples / frame.sample_rate
                if seconds > max_seconds:
                    raise too_long(f"more than {max_seconds:g} s (decoding stopped there)")
    except Problem:
        raise
    except (av.error.FFmpegError, ValueError, UnicodeDecodeError, OSError):
        raise undecodable from None
    if seconds <= 0:
        raise Problem(
            422, f"audio {name!r} holds no audio samples; send a WAV, MP3, M4A, FLAC or OGG file"
        )
    return seconds


def header_seconds(container: Any, stream: Any) -> float | None:
    """The duration the file's headers claim (stream first, then container), or None."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None
