"""The mouth bank stage: a talking clip's own mouths (`pipeline/mouth/bank.py`), from its
stored frames, its landmarks and, where it has one, the audio track of the snapshot it was
decoded from (a clip without sound is a bank of its frames alone)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from pipeline.frames import FrameSource
from pipeline.precompile.stages import Progress

logger = logging.getLogger(__name__)


def clip_audio(path: Path, name: str = "") -> np.ndarray | None:
    """The clip's audio at the bank's analysis rate, or None when it has no audio track
    or its sound cannot be decoded (one line says so, naming the clip `name`: the bank is
    then made from its frames alone)."""
    from pipeline.media import has_audio
    from pipeline.mouth.bank import FEATURE_RATE
    from pipeline.render.audio import AudioError, load_audio

    try:
        return load_audio(path, FEATURE_RATE)
    except AudioError as exc:  # no audio stream, an empty one, or one FFmpeg cannot decode
        if has_audio(path):
            logger.warning(
                "%s: its sound cannot be read (%s); its mouth bank is made from its frames alone",
                name or path.name,
                exc,
            )
        return None


def bank_stage(
    copy: Path,
    frames: FrameSource,
    landmarks: np.ndarray,
    fps: float,
    progress: Progress,
    name: str = "",
):
    from pipeline.mouth.bank import build_bank

    built = build_bank(
        len(frames),
        frames.each(),
        landmarks,
        clip_audio(copy, name),
        fps,
        progress=lambda done, total: progress("bank", done, total),
    )
    late = built.meta.get("sound_late", {})
    if late.get("late"):
        logger.warning(
            "%s: its sound comes %d ms %s its pictures (the ear's opening follows its mouth"
            " at r %.2f aligned, %.2f as shot); its mouth bank is fitted on them aligned",
            name or copy.name,
            abs(late["ms"]),
            "after" if late["late"] > 0 else "before",
            late["r_late"],
            late["r_sync"],
        )
    return built.arrays, built.meta
