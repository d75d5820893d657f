"""Stage 1, decode: every frame of the source, encoded with the frame codec (the I420
planes the encoder takes, in a JPEG: pipeline/media.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.frames import frame_name
from pipeline.parallel import ordered_map
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.stages import Progress


def decode_snapshot(copy: Path, path: Path, recipe: Recipe, progress: Progress):
    """decode_stage on the snapshot; its errors name the user's file, not the copy."""
    from pipeline.media import MediaError

    try:
        return decode_stage(copy, recipe, progress)
    except MediaError as exc:
        raise MediaError(str(exc).replace(str(copy), str(path))) from None


def decode_stage(path: Path, recipe: Recipe, progress: Progress):
    from pipeline.media import FRAME_CODEC, encode_frame, iter_frames, probe

    info = probe(path)
    total = (
        info.frames
        if recipe.max_frames == 0
        else min(info.frames or recipe.max_frames, recipe.max_frames)
    )
    arrays: dict[str, np.ndarray] = {}
    shape: tuple[int, ...] = ()

    def encode(frame: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
        return frame.shape, np.frombuffer(encode_frame(frame), np.uint8)

    # PyAV decodes on this thread while OpenCV encodes the previous frames on others
    for i, (frame_shape, data) in enumerate(
        ordered_map(encode, iter_frames(path, recipe.max_frames))
    ):
        arrays[frame_name(i)], shape = data, frame_shape
        progress("decode", i + 1, total)
    height, width = shape[:2]
    meta = {
        "frames": len(arrays),
        "fps": float(info.fps or 25.0),
        "width": int(width),
        "height": int(height),
        "frame_codec": FRAME_CODEC,
    }
    return arrays, meta
