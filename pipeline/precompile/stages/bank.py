"""The mouth bank stage: a talking clip's own mouths (`pipeline/mouth/bank.py`), from its
stored frames, its landmarks and the audio track of the snapshot it was decoded from."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.frames import FrameSource
from pipeline.precompile.stages import Progress


def clip_audio(path: Path) -> np.ndarray | None:
    """The clip's audio at the bank's analysis rate, or None when it has no audio track."""
    from pipeline.mouth.bank import FEATURE_RATE
    from pipeline.render.audio import AudioError, load_audio

    try:
        return load_audio(path, FEATURE_RATE)
    except AudioError:  # no audio stream, or an empty one: the clip does not talk
        return None


def bank_stage(
    copy: Path, frames: FrameSource, landmarks: np.ndarray, fps: float, progress: Progress
):
    from pipeline.mouth.bank import build_bank

    built = build_bank(
        len(frames),
        frames.each(),
        landmarks,
        clip_audio(copy),
        fps,
        progress=lambda done, total: progress("bank", done, total),
    )
    return built.arrays, built.meta
