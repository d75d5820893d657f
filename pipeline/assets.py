"""What a hot avatar is, as the renderers see it.

Precompile writes these arrays to the store; `load_assets` (in `pipeline/hot.py`)
reads them back. Renderers and tests depend only on this class, never on the store
layout, so a renderer can be tested on assets built in memory.

Conventions used everywhere in `pipeline/`:
- images are numpy uint8 RGB, shape (H, W, 3);
- boxes are [x1, y1, x2, y2] in full-frame pixels (x2, y2 exclusive);
- landmarks are (68, 2) float32 (x, y) in iBUG-300W order;
- a face mesh is (468, 3) float32 (x, y in full-frame pixels, z relative depth in the same
  scale), MediaPipe's point order; `pipeline/nets/mesh_topology.py` names the points.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipeline.mouth.bank import MouthBank


@dataclass
class AvatarAssets:
    key: str  # avatar key
    fps: float
    width: int
    height: int
    boxes: np.ndarray  # (N, 4) float32, tracked face boxes
    landmarks: np.ndarray  # (N, 68, 2) float32
    crop_boxes: np.ndarray  # (N, 4) int32, half-face boxes (the region a renderer redraws)
    mask_boxes: np.ndarray  # (N, 4) int32, blend squares, may extend past the frame
    masks: np.ndarray  # (N, M, M) uint8 0..255, blend weight over the blend square
    load_frame: Callable[[int], np.ndarray]  # i -> full frame (H, W, 3) uint8
    latents: np.ndarray | None = None  # (N, 8, 32, 32) float16 when a VAE was configured
    # (N, S, S, 3) uint8 crops (S = 256): inputs of the latents stage; no renderer reads
    # them, so load_assets leaves them in the store (49 MB for 250 frames)
    crops: np.ndarray | None = None
    # (N, 468, 3) float32 face mesh per frame (landmarks="facemesh", the default; None for
    # the other backends): the inner lips are mesh_topology.LIPS_INNER_UPPER / _LOWER
    mesh: np.ndarray | None = None
    # the persona's mouth bank (pipeline/mouth/bank.py), when it has talking footage and
    # the bank is hot: the warp renderer draws its mouths from there
    bank: MouthBank | None = None

    @property
    def n_frames(self) -> int:
        return int(self.boxes.shape[0])
