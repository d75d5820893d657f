"""What every renderer is, how one is chosen, and the one way regions go back in.

A renderer redraws the mouth region of stored frames for the audio. `render_video`
(pipeline/render/video.py) drives it in this order:

1. construct (cheap; checks that weights exist, raises ModelMissingError if not),
2. `prepare(assets, audio, sr, n_out, fps)` once: load models, analyse the audio,
3. `render_batch(ts, idxs, frames)` for consecutive batches of output frames.

Renderers never modify the frames they are given; `blend` returns a new frame.

**The mouth rectangle** (`render_patches`, optional; warp has it). Only the mouth region
of a frame changes, so a renderer may hand back just that: for output frame t showing
stored frame idx (the full stored frame, read-only, RGB uint8), a `MouthPatch` (a box
inside the frame and the final pixels there, already blended through the stored mask)
or None where the frame is shown as stored (silence, no face). Everything outside the
box is the stored frame, bit for bit. The render loop pastes it (`paste`) into a frame
it owns, or converts just that rectangle into whatever frame format it encodes; it
never needs a renderer's copy of the whole frame. `render_batch` and `render_owned`
are `paste` over `render_patches`.

**What it reads** (`mouth_source`, with `render_patches`: `MouthRenderer`). The hot path
keeps frames in I420 from the store to the encoder (render/compose.py); a renderer that
names the rectangle of the stored frame its patch reads and covers gets only that
rectangle converted to RGB (the `frames` it is given are valid there alone), and its
patch alone is converted back. A renderer without it gets whole RGB frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from pipeline.assets import AvatarAssets


@runtime_checkable
class Renderer(Protocol):
    name: str
    fps: float | None  # video rate the renderer needs; None = the avatar's own
    sample_rate: int  # rate `prepare` wants the audio at
    batch_size: int  # frames per `render_batch` call that use the hardware well

    def prepare(
        self, assets: AvatarAssets, audio: np.ndarray, sr: int, n_out: int, fps: float
    ) -> None:
        """Analyse `audio` (float32 mono at `sr`) for `n_out` output frames at `fps`."""

    def render_batch(
        self, ts: Sequence[int], idxs: Sequence[int], frames: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """Output frames ts (showing stored frames idxs, given as `frames`) -> full frames."""


@dataclass(frozen=True)
class MouthPatch:
    """The pixels a renderer changed in one frame: `pixels` (y2 - y1, x2 - x1, 3) uint8
    are what the output frame holds inside `box` = (x1, y1, x2, y2), which lies inside
    the frame; outside it the output is the stored frame."""

    box: tuple[int, int, int, int]
    pixels: np.ndarray


def paste(frame: np.ndarray, patch: MouthPatch | None, inplace: bool = False) -> np.ndarray:
    """`frame` with `patch` written into it: into `frame` itself when `inplace` (the
    caller owns it), else into a copy. None leaves the frame as it is."""
    out = frame if inplace else frame.copy()
    if patch is not None:
        x1, y1, x2, y2 = patch.box
        out[y1:y2, x1:x2] = patch.pixels
    return out


@runtime_checkable
class MouthRenderer(Protocol):
    def mouth_source(self, t: int, idx: int) -> tuple[int, int, int, int] | None:
        """The box [x1, y1, x2, y2] (inside the frame) of stored frame idx that output
        frame t's patch reads and covers, or None when frame t has no patch."""

    def render_patches(
        self, ts: Sequence[int], idxs: Sequence[int], frames: Sequence[np.ndarray]
    ) -> list[MouthPatch | None]:
        """Each output frame's `MouthPatch` (or None), reading `frames` (RGB uint8, full
        size) only inside its `mouth_source`."""


def fit_mask(mask: np.ndarray, box: Sequence[int]) -> np.ndarray:
    """The (M, M) mask resized to the size of its blend square `box`."""
    import cv2

    w, h = int(box[2] - box[0]), int(box[3] - box[1])
    if mask.shape == (h, w):
        return mask
    if w <= 0 or h <= 0:
        raise ValueError(f"blend square {list(box)} is empty")
    return cv2.resize(mask, (w, h), interpolation=cv2.INTER_LINEAR)


def blend(
    frame: np.ndarray,
    region_rgb: np.ndarray,
    region_box: Sequence[int],
    mask: np.ndarray,
    mask_box: Sequence[int],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Paste `region_rgb` (covering `region_box`) into `frame` through `mask`.

    `mask` is uint8 0..255 over `mask_box` (resized to it if its size differs), boxes
    are [x1, y1, x2, y2] in frame pixels and may extend past the frame; `region_rgb`
    is resized to its box if needed. Where the mask is 0, or the region does not
    reach, the result equals `frame` bit for bit; where it is 255 it is the region.
    Returns a new frame unless `out` (same shape as frame) is given.
    """
    import cv2

    if out is None:
        out = frame.copy()
    elif out is not frame:
        out[...] = frame
    h, w = frame.shape[:2]
    rx1, ry1, rx2, ry2 = (int(v) for v in region_box)
    mx1, my1, mx2, my2 = (int(v) for v in mask_box)
    x1, y1 = max(rx1, mx1, 0), max(ry1, my1, 0)
    x2, y2 = min(rx2, mx2, w), min(ry2, my2, h)
    if x2 <= x1 or y2 <= y1:
        return out
    if region_rgb.shape[:2] != (ry2 - ry1, rx2 - rx1):
        shrink = region_rgb.shape[0] > ry2 - ry1
        interp = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        region_rgb = cv2.resize(region_rgb, (rx2 - rx1, ry2 - ry1), interpolation=interp)
    mask = fit_mask(mask, (mx1, my1, mx2, my2))
    a = mask[y1 - my1 : y2 - my1, x1 - mx1 : x2 - mx1, None].astype(np.uint16)
    src = region_rgb[y1 - ry1 : y2 - ry1, x1 - rx1 : x2 - rx1].astype(np.uint16)
    dst = out[y1:y2, x1:x2].astype(np.uint16)
    # Integer mix, rounded: a=0 gives dst*255/255 = dst exactly, a=255 gives src.
    out[y1:y2, x1:x2] = ((dst * (255 - a) + src * a + 127) // 255).astype(np.uint8)
    return out
