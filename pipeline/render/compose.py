"""Stored I420 frames and a renderer's mouths -> the frames the encoder takes.

With a `MouthRenderer` (warp), each output frame is the stored frame's planes with the
renderer's mouth patch written in (`pipeline.yuv.paste_patch`); only the rectangle the
renderer reads is converted to RGB, and only its patch back. A frame without a patch
goes to the encoder as decoded. Any other renderer (musetalk) draws on whole RGB frames,
converted both ways here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from pipeline.render.renderers.base import MouthRenderer, Renderer

# Per thread, the whole-frame RGB arrays the mouths' rectangles are converted into, one
# per frame of a batch: reused, as nothing holds them once compose returns (the
# renderers copy what they keep).
_UNDER = threading.local()


def _under_buffers(n: int, height: int, width: int) -> list[np.ndarray]:
    bufs = getattr(_UNDER, "bufs", [])
    bufs = [b for b in bufs if b.shape == (height, width, 3)]
    while len(bufs) < n:
        bufs.append(np.empty((height, width, 3), np.uint8))
    _UNDER.bufs = bufs
    return bufs[:n]


def compose(
    renderer: Renderer,
    ts: Sequence[int],
    idxs: Sequence[int],
    frames: Sequence,
    width: int,
    height: int,
    owned: Sequence[bool] | None = None,
) -> list:
    """Output frames ts (showing stored frames idxs, given as I420 `frames`) -> I420
    frames of width x height (even) for the encoder. A frame is read-only unless its
    `owned` flag says it is the caller's (pipeline.frames.ScheduledFrames: decoded for
    this use alone): the mouth is then written into it, saving a whole-frame copy
    (3 MB at 1080x1920) on every frame of a loop longer than the frame cache."""
    from pipeline.yuv import copy_frame, frame_from_rgb, paste_patch, sparse_rgb, to_rgb

    if isinstance(renderer, MouthRenderer):
        boxes = [renderer.mouth_source(t, i) for t, i in zip(ts, idxs, strict=True)]
        moving = [k for k, box in enumerate(boxes) if box is not None]
        bufs = _under_buffers(len(moving), frames[0].height, frames[0].width) if moving else []
        under = {
            k: sparse_rgb(frames[k], boxes[k], b)[0] for k, b in zip(moving, bufs, strict=True)
        }
        patches = renderer.render_patches(
            [ts[k] for k in moving], [idxs[k] for k in moving], [under[k] for k in moving]
        )
        out = [
            f if (f.width, f.height) == (width, height) else copy_frame(f, width, height)
            for f in frames
        ]
        for k, patch in zip(moving, patches, strict=True):
            if patch is not None:
                if out[k] is frames[k] and not (owned and owned[k]):
                    out[k] = copy_frame(frames[k], width, height)  # the stored one is shared
                paste_patch(out[k], patch.box, patch.pixels, under[k])
        return out
    rgb = [to_rgb(f) for f in frames]  # new arrays: the renderer may draw into them
    render_owned = getattr(renderer, "render_owned", None)
    if render_owned is not None:
        drawn = render_owned(list(ts), list(idxs), rgb, [True] * len(rgb))
    else:
        drawn = renderer.render_batch(list(ts), list(idxs), rgb)
    return [frame_from_rgb(d[:height, :width]) for d in drawn]
