"""`warp`: the default renderer, no weights. Opens the mouth with the audio's loudness.

For output frame t showing stored frame i:

1. openness o = loudness envelope of the audio at the video rate (0 = closed);
2. move the stored landmarks of frame i: jaw (4-12) and lower lip (55-59, 65-67)
   down by o x a fraction of the lower-face height, upper lip a little up; the nose,
   the upper jaw line and points under the chin stay put;
3. turn the moves into a smooth displacement field (normalised Gaussian weights of
   the landmark moves, with a constant "stay" weight so it fades to 0 away from the
   mouth), computed on a coarse grid and upsampled, and `cv2.remap` the region;
4. darken the inner mouth (polygon 60-67 after the move) in proportion to o;
5. blend back through the stored mask.

Only the part of the blend square where the mask is non-zero is touched, so the
cost per frame is a few small array operations whatever the frame size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.assets import AvatarAssets
from pipeline.render.audio import loudness_envelope
from pipeline.render.renderers.base import blend, fit_mask

# Landmark moves at openness 1, as fractions of the lower-face height (nose 33 to
# chin 8); positive is down. Jaw and lip corners taper towards the sides.
JAW_DROP = 0.16
LIP_DROP = 0.19
UPPER_RAISE = 0.03
CORNER_DROP = 0.06
MOVES: dict[int, float] = {
    **{
        i: JAW_DROP * w
        for i, w in zip(range(4, 13), (0.3, 0.5, 0.7, 0.9, 1, 0.9, 0.7, 0.5, 0.3), strict=True)
    },
    **{i: LIP_DROP * w for i, w in zip(range(55, 60), (0.7, 0.9, 1, 0.9, 0.7), strict=True)},
    **{i: LIP_DROP * w for i, w in zip((65, 66, 67), (0.85, 1, 0.85), strict=True)},
    **{i: -UPPER_RAISE for i in (49, 50, 51, 52, 53, 61, 62, 63)},
    **{i: CORNER_DROP for i in (48, 54, 60, 64)},
}
STILL = (*range(0, 4), *range(13, 17), *range(27, 36))  # anchors: upper jaw line, nose
UNDER_CHIN = range(5, 12)  # anchors this far below these jaw points keep the neck still
UNDER_CHIN_DEPTH = 0.6
SIGMA = 0.22  # Gaussian width, x lower-face height
STAY = 0.05  # weight of "no move" everywhere: the field fades out past ~2.5 sigma
MOUTH_RGB = np.array([50, 20, 25], np.float32)  # colour of a dark open mouth
MOUTH_DARK_ALL = 0.3  # darkening of the whole inner mouth at openness 1 ...
MOUTH_DARK_CORE = 0.5  # ... plus this in the core band where the teeth part
CORE_SQUEEZE = 0.45  # core band height / inner mouth height


@dataclass
class _Plan:
    """What frame i needs, computed once: where to work and the unit displacement."""

    box: tuple[int, int, int, int]  # work region in frame coords: mask > 0, in frame
    src: tuple[int, int, int, int]  # source patch the remap reads (box + margin)
    field: np.ndarray  # (gh, gw, 2) float32 displacement at openness 1, coarse
    inner: np.ndarray  # (8, 2) inner lip points 60-67, frame coords
    inner_move: np.ndarray  # (8, 2) their move at openness 1
    scale: float  # lower-face height, px


class WarpRenderer:
    name = "warp"
    fps: float | None = None  # any rate: follows the avatar
    sample_rate = 48000  # loudness works at any rate; 48 kHz keeps the output audio intact
    batch_size = 4

    def __init__(self) -> None:
        self._assets: AvatarAssets | None = None
        self._open = np.zeros(0, np.float32)
        self._plans: dict[int, _Plan | None] = {}

    # 1. audio -> openness per output frame
    def prepare(
        self, assets: AvatarAssets, audio: np.ndarray, sr: int, n_out: int, fps: float
    ) -> None:
        env = loudness_envelope(audio, sr, fps)
        self._open = np.zeros(n_out, np.float32)
        self._open[: min(n_out, env.size)] = env[:n_out]
        self._assets = assets
        self._plans = {}

    def openness(self) -> np.ndarray:
        return self._open

    def render_batch(
        self, ts: Sequence[int], idxs: Sequence[int], frames: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        return [self.render(t, i, f) for t, i, f in zip(ts, idxs, frames, strict=True)]

    def render(self, t: int, idx: int, frame: np.ndarray) -> np.ndarray:
        if self._assets is None:
            raise RuntimeError("WarpRenderer.render() before prepare()")
        o = float(self._open[t]) if t < self._open.size else 0.0
        plan = self._plan(int(idx))
        if plan is None or o <= 1e-3:
            return frame.copy()
        region = self._warp(frame, plan, o)
        a = self._assets
        mbox = a.mask_boxes[idx]
        mask = fit_mask(a.masks[idx], mbox)
        x1, y1, x2, y2 = plan.box
        mask = mask[y1 - mbox[1] : y2 - mbox[1], x1 - mbox[0] : x2 - mbox[0]]
        return blend(frame, region, plan.box, mask, plan.box)

    # 2-3. the displacement field of frame i, at openness 1 (it scales linearly)
    def _plan(self, idx: int) -> _Plan | None:
        if idx not in self._plans:
            self._plans[idx] = _make_plan(self._assets, idx)
        return self._plans[idx]

    # 3-4. remap the work region and darken the opened mouth
    def _warp(self, frame: np.ndarray, plan: _Plan, o: float) -> np.ndarray:
        import cv2

        x1, y1, x2, y2 = plan.box
        sx1, sy1, sx2, sy2 = plan.src
        field = cv2.resize(plan.field, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR)
        # Backward map: output pixel p reads the source at p - o * d(p).
        map_x = field[..., 0] * -o + np.arange(x1 - sx1, x2 - sx1, dtype=np.float32)[None, :]
        map_y = field[..., 1] * -o + np.arange(y1 - sy1, y2 - sy1, dtype=np.float32)[:, None]
        src = frame[sy1:sy2, sx1:sx2]
        out = cv2.remap(src, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        _darken_mouth(out, plan, o, (x1, y1))
        return out


def _make_plan(assets: AvatarAssets, idx: int) -> _Plan | None:
    """Geometry and coarse unit field for stored frame idx; None if there is nothing to do."""
    lm = np.asarray(assets.landmarks[idx], np.float32)
    if not np.isfinite(lm).all():
        return None
    scale = float(lm[8, 1] - lm[33, 1])
    if scale < 4.0:
        return None
    # Work box: where the mask is non-zero, inside the frame.
    mbox = [int(v) for v in assets.mask_boxes[idx]]
    mask = fit_mask(assets.masks[idx], mbox)
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        return None
    x1, y1 = max(mbox[0] + int(xs.min()), 0), max(mbox[1] + int(ys.min()), 0)
    x2 = min(mbox[0] + int(xs.max()) + 1, assets.width)
    y2 = min(mbox[1] + int(ys.max()) + 1, assets.height)
    if x2 <= x1 or y2 <= y1:
        return None
    margin = int(math.ceil(scale * max(abs(v) for v in MOVES.values()))) + 2
    src = (
        max(x1 - margin, 0),
        max(y1 - margin, 0),
        min(x2 + margin, assets.width),
        min(y2 + margin, assets.height),
    )

    # Control points: moving landmarks, still anchors, and anchors under the chin.
    moving = np.array(sorted(MOVES), np.int64)
    moves = np.array([MOVES[i] for i in moving], np.float32) * scale
    under = lm[list(UNDER_CHIN)] + np.array([0.0, UNDER_CHIN_DEPTH * scale], np.float32)
    ctrl = np.concatenate([lm[moving], lm[list(STILL)], under])
    disp = np.zeros((ctrl.shape[0], 2), np.float32)
    disp[: moving.size, 1] = moves

    # Coarse grid sampled where cv2.resize will read it back (pixel-centre aligned).
    w, h = x2 - x1, y2 - y1
    step = max(2.0, scale * 0.05)
    gw, gh = max(2, int(math.ceil(w / step))), max(2, int(math.ceil(h / step)))
    gx = x1 + (np.arange(gw, dtype=np.float32) + 0.5) * (w / gw) - 0.5
    gy = y1 + (np.arange(gh, dtype=np.float32) + 0.5) * (h / gh) - 0.5
    pts = np.stack(np.meshgrid(gx, gy), axis=-1).reshape(-1, 2)
    d2 = ((pts[:, None, :] - ctrl[None, :, :]) ** 2).sum(-1)
    wts = np.exp(-d2 / (2.0 * (SIGMA * scale) ** 2))
    field = (wts @ disp) / (wts.sum(1, keepdims=True) + STAY)

    inner_ids = list(range(60, 68))
    inner_move = np.zeros((8, 2), np.float32)
    inner_move[:, 1] = [MOVES[i] * scale for i in inner_ids]
    return _Plan(
        box=(x1, y1, x2, y2),
        src=src,
        field=field.reshape(gh, gw, 2).astype(np.float32),
        inner=lm[inner_ids],
        inner_move=inner_move,
        scale=scale,
    )


def _darken_mouth(region: np.ndarray, plan: _Plan, o: float, origin: tuple[int, int]) -> None:
    """Darken the opened inner-lip polygon in place, with soft edges.

    The stored mouth may already show teeth: the whole polygon is darkened only a
    little, and a core band (the polygon squeezed towards its middle, where upper and
    lower teeth part) a lot, so the teeth stay visible above and below the gap.
    """
    import cv2

    poly = plan.inner + o * plan.inner_move - np.array(origin, np.float32)
    blur = max(1.0, 0.02 * plan.scale)
    pad = int(math.ceil(3 * blur)) + 1
    h, w = region.shape[:2]
    bx1, by1 = np.floor(poly.min(0)).astype(int) - pad
    bx2, by2 = np.ceil(poly.max(0)).astype(int) + pad + 1
    bx1, by1, bx2, by2 = max(bx1, 0), max(by1, 0), min(bx2, w), min(by2, h)
    if bx2 <= bx1 or by2 <= by1:
        return
    poly = poly - [bx1, by1]
    mid_y = poly[:, 1].mean() + 0.1 * np.ptp(poly[:, 1])
    core = poly.copy()
    core[:, 1] = mid_y + (core[:, 1] - mid_y) * CORE_SQUEEZE
    m = np.zeros((by2 - by1, bx2 - bx1), np.float32)
    for shape, weight in ((poly, MOUTH_DARK_ALL), (core, MOUTH_DARK_CORE)):
        layer = np.zeros_like(m)
        pts = np.round(shape * 16).astype(np.int32)  # 4 fractional bits: sub-pixel edges
        cv2.fillPoly(layer, [pts], 1.0, lineType=cv2.LINE_AA, shift=4)
        m += weight * layer
    m = cv2.GaussianBlur(m, (0, 0), blur)
    alpha = o * m[..., None]
    patch = region[by1:by2, bx1:bx2].astype(np.float32)
    region[by1:by2, bx1:bx2] = (patch + alpha * (MOUTH_RGB - patch) + 0.5).astype(np.uint8)
