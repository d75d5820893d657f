"""Checks an upload passes before it costs any work: its size, and that it is audio of
an acceptable length (decoded here, in the server, so a bad file never reaches a worker)."""

from __future__ import annotations

from pathlib import Path

from fastapi import UploadFile

from hotplate.serve.problems import Problem

AUDIO_SUFFIXES = (".wav", ".mp3", ".m4a", ".aac", ".flac", ".ogg", ".opus", ".webm")
CHUNK = 1 << 20


async def save_upload(upload: UploadFile, target_stem: Path, max_bytes: int) -> Path:
    """Write the upload to target_stem + its suffix; Problem 413 past max_bytes."""
    suffix = Path(upload.filename or "").suffix.lower()
    target = target_stem.with_suffix(suffix if suffix in AUDIO_SUFFIXES else ".audio")
    size = 0
    with open(target, "wb") as out:
        while chunk := await upload.read(CHUNK):
            size += len(chunk)
            if size > max_bytes:
                out.close()
                target.unlink(missing_ok=True)
                raise Problem(
                    413,
                    f"audio upload is over the {max_bytes / 1e6:g} MB limit; send a shorter "
                    "or compressed clip",
                )
            out.write(chunk)
    return target


def check_audio(path: Path, name: str, max_seconds: float) -> float:
    """The clip's duration in seconds; Problem 415 (not decodable audio) or 422 (empty,
    too long)."""
    from pipeline.render.audio import AudioError, AudioFormatError, load_audio

    sr = 16000
    try:
        samples = load_audio(path, sr)
    except AudioError as exc:
        undecodable = isinstance(exc, AudioFormatError)
        what = "is not decodable audio" if undecodable else "holds no audio samples"
        raise Problem(
            415 if undecodable else 422,
            f"audio {name!r} {what}; send a WAV, MP3, M4A, FLAC or OGG file",
        ) from None
    seconds = samples.size / sr
    if seconds > max_seconds:
        raise Problem(
            422,
            f"audio {name!r} lasts {seconds:.1f} s, over the {max_seconds:g} s limit; "
            "split it into shorter clips",
        )
    return seconds
