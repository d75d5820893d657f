"""Stage 2, track: face boxes for every frame, detected on keyframe proxies."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.frames import FrameSource
from pipeline.nets.modelcache import kept
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.stages import Progress


def track_stage(path: Path, recipe: Recipe, frames: FrameSource, progress: Progress):
    from pipeline.nets.detectors import load_detector
    from pipeline.precompile.tracking import track

    detector = kept(
        "detector",
        recipe.detector,
        recipe.models_dir,
        lambda: load_detector(recipe.detector, recipe.models_dir),
    )
    n = len(frames)
    detected = 0

    def on_batch(k: int) -> None:  # track reports frames per detector batch, not a total
        nonlocal detected
        detected += k
        progress("track", detected, n)

    result = track(
        n,
        lambda i: frames.proxy(i, recipe.proxy),
        detector,
        stride=recipe.stride,
        refine_iou=recipe.refine_iou,
        refine_shift=recipe.refine_shift,
        face=recipe.face,
        progress=on_batch,
        source=str(path),
    )
    counts = {
        "keyframes": len(result.keyframes),
        "refined": len(result.refined),
        "healed": len(result.healed),
        "detections": result.detections,
    }
    meta = {
        "counts": counts,
        "detector_seconds": result.detector_seconds,
        "keyframes": list(result.keyframes),
        "refined": list(result.refined),
        "healed": list(result.healed),
    }
    return {"boxes": result.boxes.astype(np.float32)}, meta
