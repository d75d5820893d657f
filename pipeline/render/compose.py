"""Stored I420 frames and a renderer's mouths -> the frames the encoder takes.

With a `MouthRenderer` (warp), each output frame is the stored frame's planes with the
renderer's mouth patch written in (`pipeline.yuv.paste_patch`); only the rectangle the
renderer reads is converted to RGB, and only its patch back. A frame without a patch
goes to the encoder as decoded. Any other renderer (musetalk) draws on whole RGB frames,
converted both ways here.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.render.renderers.base import MouthRenderer, Renderer


def compose(
    renderer: Renderer,
    ts: Sequence[int],
    idxs: Sequence[int],
    frames: Sequence,
    width: int,
    height: int,
) -> list:
    """Output frames ts (showing stored frames idxs, given as I420 `frames`, shared and
    read-only) -> I420 frames of width x height (even) for the encoder."""
    from pipeline.yuv import copy_frame, frame_from_rgb, paste_patch, sparse_rgb, to_rgb

    if isinstance(renderer, MouthRenderer):
        boxes = [renderer.mouth_source(t, i) for t, i in zip(ts, idxs, strict=True)]
        moving = [k for k, box in enumerate(boxes) if box is not None]
        under = {k: sparse_rgb(frames[k], boxes[k])[0] for k in moving}
        patches = renderer.render_patches(
            [ts[k] for k in moving], [idxs[k] for k in moving], [under[k] for k in moving]
        )
        out = [
            f if (f.width, f.height) == (width, height) else copy_frame(f, width, height)
            for f in frames
        ]
        for k, patch in zip(moving, patches, strict=True):
            if patch is not None:
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
