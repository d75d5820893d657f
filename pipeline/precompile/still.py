"""Stilling a talking loop: each stored frame's lips brought to the presenter's rest pose.

A loop shot while the presenter spoke keeps its own mouth motion under whatever mouth a
renderer draws, so the new speech and the old one play at once. Stilling takes the old
motion out before any mouth goes on, once, at precompile:

1. the mouth's opening in every frame (`pipeline/mouth/lips.py`: the inner lips' gap in
   the canonical face frame, from the landmarks the face mesh gives); a loop whose
   opening hardly varies (`QUIET_SPREAD`) is quiet and is left exactly as it is;
2. the rest pose: the median canonical landmarks of the loop's quietest frames (the
   smallest openings), placed in each frame by that frame's canonical similarity (eyes
   and nose) and shifted so its upper lip sits on the frame's own (the upper lip moves
   least in speech; this absorbs what a 2-D similarity cannot, such as a slight yaw);
3. per frame, the warp renderer's kind of field (`pipeline/render/renderers/warp.py`):
   normalised Gaussian weights of the landmark moves, a constant "stay" weight, anchors
   on the nose and the upper jaw line and under the chin, and the split at the line
   where the lips meet, so a pixel above it follows the upper lip and one below it the
   lower lip. Here it is a backward map in the target geometry (each pixel of the stilled
   frame reads the stored frame where its lips were), evaluated at full resolution so
   the seam stays sharp: an open mouth closes over its interior instead of squeezing it
   into a dark line. The control moves are refined a few times so the field takes each
   lip point where it is sent (Gaussian weights alone do not interpolate);
4. the stilled landmarks: where the field actually put each stored lip point (its inverse,
   by fixed-point iteration), so a renderer opens the mouth from the lips it shows.

The stage (`pipeline/precompile/stages/still.py`) stores the stilled pixels of each
changed frame as a small patch; `pipeline/frames.py::StilledFrames` pastes it into the
decoded frame, so a render pays one small JPEG decode per stored-frame decode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.mouth.lips import apply, invert, mouth_shape, to_canonical

VERSION = 2  # bumped when what the still stage stores changes (its key has it); 2: a
# still photographed with its lips apart is shut (`shut_rest`)

# The points stilling moves: the jaw under the mouth and every lip point; the others stay.
JAW_MOVING = tuple(range(4, 13))
LIP_POINTS = tuple(range(48, 68))
MOVING = JAW_MOVING + LIP_POINTS
UPPER_LIP = (49, 50, 51, 52, 53)  # the rest pose is placed on the frame's own upper lip
# anchors that never move (the warp renderer's): the upper jaw line and the nose
ANCHORS = (*range(0, 4), *range(13, 17), *range(27, 36))
UNDER_CHIN = tuple(range(5, 12))  # anchors this far below these jaw points: the neck stays
UNDER_CHIN_DEPTH = 0.6
# which side of the lip line a control point is on: -1 above (it moves pixels above the
# line), +1 below, 0 both (the corners)
UPPER_SIDE = (49, 50, 51, 52, 53, 61, 62, 63)
LOWER_SIDE = (*JAW_MOVING, 55, 56, 57, 58, 59, 65, 66, 67)
INNER_UPPER = (61, 62, 63)
INNER_LOWER = (65, 66, 67)
INNER_LIPS = tuple(range(60, 68))
SIGMA = 0.16  # Gaussian width, x lower-face height (the renderer's 0.22 blurs the lip line)
STAY = 0.05  # weight of "no move" everywhere
ACROSS_MOUTH = 0.0  # weight of a control across the lip line, in the mouth's middle
REFINE = 6  # passes that correct the control moves so the field meets them
# The inner lips each read this far into their own lip (x lower-face height): the
# landmarks sit on the edge of the dark interior, and a seam read there would be dark.
SEAM_MARGIN = 0.04
GRID = 0.03  # coarse grid step, x lower-face height
REACH = 2.8  # the field is computed this many sigma around the moving points ...
TAPER = 0.3  # ... and fades to 0 over this share of the box's half-size at its edges
QUIET_SPREAD = 0.04  # opening range (10th-90th percentile, eye-distance units): quiet below
REST_SHARE = 0.1  # the quietest 10 % of frames make the rest pose (at least REST_MIN)
REST_MIN = 3
KEEP_PX = 0.25  # px: pixels the field moves less than this keep the stored frame's bytes
MIN_MOVE = 0.75  # px: a frame whose lips are this close to rest everywhere is not touched
# A still (one frame) whose inner lips are further apart than this (canonical units, the
# eye distance) is shut: its rest pose is its own with the lower lip raised to the upper,
# the jaw under it by a share of that, so a render shows closed lips in silence and opens
# them from there (the render's opening is added to the still's: photographed open, it
# never closed and opened twice as wide as speech; testkit/still_mouth.py).
SHUT_OPENING = 0.12  # the face mesh reads many closed mouths as a little open: 0.03-0.11
# on the six HDTF clips' most closed held-out frames (menendez's 0.114 where dlib reads
# 0.003 mouth widths), and open ones (dlib 0.13-0.21) at 0.05-0.19: markey's (0.108 at
# precompile) and grid_s1's (0.054) stay open, a limit of the face mesh's lips
# The lower lip goes this much past the upper inner lip (canonical units): the face mesh
# puts the inner lips a little inside the teeth's edge, and shut to the points exactly a
# sliver of teeth stayed (katie_hill's open still: the referee's gap 0.21 to 0.14).
SHUT_OVERLAP = 0.02
SHUT_LIP = {55: 0.7, 56: 0.9, 57: 1.0, 58: 0.9, 59: 0.7, 65: 1.0, 66: 1.0, 67: 1.0}
SHUT_JAW = {
    i: 0.67 * w
    for i, w in zip(range(4, 13), (0.3, 0.5, 0.7, 0.9, 1, 0.9, 0.7, 0.5, 0.3), strict=True)
}


@dataclass
class Rest:
    """The presenter's rest pose and how the loop's mouth moved."""

    canonical: np.ndarray  # (68, 2) median canonical landmarks of the quietest frames
    frames: list[int]  # the frames it was taken from
    openings: np.ndarray  # (N,) each frame's opening, canonical units (nan: no face)
    spread: float  # 90th minus 10th percentile of the openings

    @property
    def quiet(self) -> bool:
        return self.spread < QUIET_SPREAD


def rest_pose(landmarks: np.ndarray) -> Rest | None:
    """The loop's rest pose from its quietest frames; None when no frame has a face."""
    n = len(landmarks)
    openings = np.full(n, np.nan, np.float64)
    canon = np.full((n, 68, 2), np.nan, np.float64)
    for i, lm in enumerate(landmarks):
        if np.isfinite(lm).all():
            m = to_canonical(lm)
            openings[i] = float(mouth_shape(lm, m)[0])
            canon[i] = apply(m, lm)
    ok = np.flatnonzero(np.isfinite(openings))
    if ok.size == 0:
        return None
    lo, hi = np.quantile(openings[ok], [0.1, 0.9])
    k = min(ok.size, max(REST_MIN, int(math.ceil(REST_SHARE * ok.size))))
    quietest = ok[np.argsort(openings[ok], kind="stable")[:k]]
    return Rest(
        canonical=np.median(canon[quietest], axis=0),
        frames=sorted(int(i) for i in quietest),
        openings=openings,
        spread=float(hi - lo),
    )


def shut_rest(rest: Rest) -> Rest | None:
    """A still's rest pose with its lips shut, or None when they are shut already
    (opening under SHUT_OPENING): in the canonical face, each lower inner lip point
    (65-67) goes up to the upper one across from it (61-63), the lower outer lip and the
    jaw under it by a share of the mean of those moves (the warp renderer's taper)."""
    c = np.asarray(rest.canonical, np.float64)
    gaps = c[[67, 66, 65], 1] - c[[61, 62, 63], 1]
    if float(gaps.mean()) <= SHUT_OPENING:
        return None
    shut = c.copy()
    lifts = np.maximum(gaps, 0.0) + SHUT_OVERLAP
    shut[[67, 66, 65], 1] -= lifts
    lift = float(lifts.mean())
    for i, w in (SHUT_LIP | SHUT_JAW).items():
        if i not in (65, 66, 67):
            shut[i, 1] -= w * lift
    return Rest(shut, rest.frames, rest.openings, rest.spread)


def rest_targets(lm: np.ndarray, rest: Rest) -> np.ndarray:
    """(68, 2) frame i's landmarks with the moving points at the rest pose."""
    lm = np.asarray(lm, np.float64)
    placed = apply(invert(to_canonical(lm)), rest.canonical)
    up = list(UPPER_LIP)
    placed += lm[up].mean(0) - placed[up].mean(0)
    out = lm.copy()
    out[list(MOVING)] = placed[list(MOVING)]
    return out


@dataclass
class Stilled:
    box: tuple[int, int, int, int]  # even-aligned [x1, y1, x2, y2] of `pixels`
    pixels: np.ndarray  # (h, w, 3) uint8, the stilled frame there
    landmarks: np.ndarray  # (68, 2) float32, where the stilled frame's points are


def _axes(lm: np.ndarray) -> np.ndarray:
    """(2, 2) unit vectors across (right eye to left eye) and down the face."""
    across = lm[42:48].mean(0) - lm[36:42].mean(0)
    norm = float(np.linalg.norm(across))
    across = across / norm if norm > 1e-6 else np.array([1.0, 0.0])
    return np.stack([across, np.array([-across[1], across[0]])])


class _Field:
    """The backward map of one frame: stilled pixel q reads the stored frame at q + d(q)."""

    def __init__(self, src: np.ndarray, tgt: np.ndarray, box: tuple[int, int, int, int]):
        self.axes = _axes(tgt)
        self.scale = float((tgt[8] - tgt[33]) @ self.axes[1])
        down = self.axes[1]
        moving = list(MOVING)
        under = src[list(UNDER_CHIN)] + UNDER_CHIN_DEPTH * self.scale * down
        self.ctrl = np.concatenate([tgt[moving], src[list(ANCHORS)], under])
        side = {i: -1.0 for i in UPPER_SIDE} | {i: 1.0 for i in LOWER_SIDE}
        self.ctrl_side = np.array(
            [side.get(i, 0.0) for i in moving] + [-1.0] * len(ANCHORS) + [1.0] * len(UNDER_CHIN)
        )
        # what each moving point should read: its stored place, the inner lips a little
        # into their own lip when the stored mouth is open wider than the rest
        want = src[moving] - tgt[moving]
        margin = SEAM_MARGIN * self.scale
        gap = float(np.mean((src[list(INNER_LOWER)] - src[list(INNER_UPPER)]) @ down))
        rest_gap = float(np.mean((tgt[list(INNER_LOWER)] - tgt[list(INNER_UPPER)]) @ down))
        if gap - rest_gap > 2 * margin:
            for i in INNER_UPPER:
                want[moving.index(i)] -= margin * down
            for i in INNER_LOWER:
                want[moving.index(i)] += margin * down
        self.n_moving = len(moving)
        self.origin = (tgt[48] + tgt[54]) / 2
        self.lines = _lip_lines((tgt[60:68] - self.origin) @ self.axes.T)
        self.half = max(float(np.linalg.norm(tgt[54] - tgt[48])) / 2, 1.0)
        self.box = box
        own = np.array([side.get(i, 0.0) for i in moving])
        self.values = np.zeros_like(self.ctrl)
        self.values[: self.n_moving] = want
        for _ in range(REFINE):  # move the controls' values until the field meets them
            got = self.at(tgt[moving], own)
            self.values[: self.n_moving] += want - got

    def sides(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(side, middle) of points: -1 above the lip line, +1 below; 1 at the mouth's
        centre falling to 0 at its corners."""
        ua, ub, la, lb = self.lines
        p = (pts - self.origin) @ self.axes.T
        mid = (ub + np.interp(ua, la, lb)) / 2
        side = np.where(p[:, 1] > np.interp(p[:, 0], ua, mid), 1.0, -1.0)
        middle = np.clip(1.0 - np.abs(p[:, 0]) / self.half, 0.0, 1.0) ** 0.5
        return side, middle

    def below(self, x1: int, y1: int, w: int, h: int) -> np.ndarray:
        """(h, w) bool: the pixels of the box at (x1, y1) below the lip line (float32,
        separable: the per-pixel part of the field)."""
        ua, ub, la, lb = self.lines
        mid = ((ub + np.interp(ua, la, lb)) / 2).astype(np.float32)
        ax, ay = self.axes.astype(np.float32)
        x = np.arange(x1, x1 + w, dtype=np.float32)[None, :] - np.float32(self.origin[0])
        y = np.arange(y1, y1 + h, dtype=np.float32)[:, None] - np.float32(self.origin[1])
        across = x * ax[0] + y * ax[1]
        down = x * ay[0] + y * ay[1]
        return down > np.interp(across, ua.astype(np.float32), mid)

    def taper(self, pts: np.ndarray) -> np.ndarray:
        x1, y1, x2, y2 = self.box
        cx, cy, hx, hy = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        tx = np.clip((hx - np.abs(pts[:, 0] - cx)) / (TAPER * hx), 0.0, 1.0)
        ty = np.clip((hy - np.abs(pts[:, 1] - cy)) / (TAPER * hy), 0.0, 1.0)
        t = tx * ty
        return t * t * (3.0 - 2.0 * t)

    def at(self, pts: np.ndarray, sides: np.ndarray | None = None) -> np.ndarray:
        """d at points (P, 2); `sides`: the points' own side where known (0: look it up)."""
        pts = np.asarray(pts, np.float64)
        p = (pts - self.origin).astype(np.float32)  # about the mouth: float32 is exact enough
        c = (self.ctrl - self.origin).astype(np.float32)
        d2 = (p * p).sum(1)[:, None] + (c * c).sum(1)[None, :] - 2.0 * (p @ c.T)
        w = np.exp(d2 * np.float32(-0.5 / (SIGMA * self.scale) ** 2))
        side, middle = self.sides(pts)
        if sides is not None:
            side = np.where(sides != 0, sides, side)
        across = (side[:, None] * self.ctrl_side[None, :]) < 0
        keep = (1.0 - (1.0 - ACROSS_MOUTH) * middle).astype(np.float32)
        w = np.where(across, w * keep[:, None], w)
        d = (w @ self.values.astype(np.float32)) / (w.sum(1, keepdims=True) + np.float32(STAY))
        return d.astype(np.float64) * self.taper(pts)[:, None]


def _lip_lines(pts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Upper and lower inner lip lines of face-axis points (8, 2) [60..67] as (across,
    down) samples sorted by across (straight segments between the points)."""
    out = []
    for ids in ((60, 61, 62, 63, 64), (60, 67, 66, 65, 64)):
        line = pts[[i - 60 for i in ids]]
        line = line[np.argsort(line[:, 0], kind="stable")]
        out += [line[:, 0], line[:, 1]]
    return tuple(out)


def still_frame(frame: np.ndarray, lm: np.ndarray, rest: Rest) -> Stilled | None:
    """Frame (H, W, 3) uint8 with its lips at rest, over the box it changes; None when the
    lips are at rest already (within MIN_MOVE px) or the face is too small to move."""
    import cv2

    lm = np.asarray(lm, np.float64)
    if not np.isfinite(lm).all():
        return None
    tgt = rest_targets(lm, rest)
    moves = np.linalg.norm(tgt[list(MOVING)] - lm[list(MOVING)], axis=1)
    if float(moves.max()) < MIN_MOVE:
        return None
    h, w = frame.shape[:2]
    axes = _axes(tgt)
    scale = float((tgt[8] - tgt[33]) @ axes[1])
    if scale < 4.0:
        return None
    pts = np.concatenate([lm[list(MOVING)], tgt[list(MOVING)]])
    reach = REACH * SIGMA * scale
    x1 = max(int(math.floor(pts[:, 0].min() - reach)) & ~1, 0)
    y1 = max(int(math.floor(pts[:, 1].min() - reach)) & ~1, 0)
    x2 = min(int(math.ceil(pts[:, 0].max() + reach) + 1) & ~1, w)
    y2 = min(int(math.ceil(pts[:, 1].max() + reach) + 1) & ~1, h)
    if x2 - x1 < 4 or y2 - y1 < 4:
        return None
    field = _Field(lm, tgt, (x1, y1, x2, y2))
    # The field is smooth on each side of the lip line, so each side's is computed on a
    # coarse grid and upsampled; the side itself is looked up per pixel (a sharp seam).
    bw, bh = x2 - x1, y2 - y1
    step = max(1.0, GRID * scale)
    gw, gh = max(2, int(math.ceil(bw / step))), max(2, int(math.ceil(bh / step)))
    gx = x1 + (np.arange(gw) + 0.5) * (bw / gw) - 0.5
    gy = y1 + (np.arange(gh) + 0.5) * (bh / gh) - 0.5
    coarse = np.stack(np.meshgrid(gx, gy), axis=-1).reshape(-1, 2)
    below = field.below(x1, y1, bw, bh)
    above_d, below_d = (
        cv2.resize(
            field.at(coarse, np.full(coarse.shape[0], s)).astype(np.float32).reshape(gh, gw, 2),
            (bw, bh),
            interpolation=cv2.INTER_LINEAR,
        )
        for s in (-1.0, 1.0)
    )
    disp = np.where(below[..., None], below_d, above_d)
    # only what the field moves is kept (the patch a render decodes is that small)
    moved = np.maximum(np.abs(disp[..., 0]), np.abs(disp[..., 1])) > KEEP_PX  # (a max over
    # the last axis of 2 is numpy's slow path)
    rows, cols = np.flatnonzero(moved.any(1)), np.flatnonzero(moved.any(0))
    if rows.size == 0:
        return None
    ky1, kx1 = int(rows[0]) & ~1, int(cols[0]) & ~1
    ky2, kx2 = min((int(rows[-1]) + 2) & ~1, bh), min((int(cols[-1]) + 2) & ~1, bw)
    disp = disp[ky1:ky2, kx1:kx2]
    map_x = disp[..., 0] + np.arange(x1 + kx1, x1 + kx2, dtype=np.float32)[None, :]
    map_y = disp[..., 1] + np.arange(y1 + ky1, y1 + ky2, dtype=np.float32)[:, None]
    pixels = cv2.remap(
        np.ascontiguousarray(frame), map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    box = (x1 + kx1, y1 + ky1, x1 + kx2, y1 + ky2)
    return Stilled(box, pixels, _moved_points(field, lm, tgt).astype(np.float32))


def _moved_points(field: _Field, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """(68, 2) where the field put each stored point: q with q + d(q) = src (fixed-point
    iteration from the target); points it does not move stay where they were."""
    moving = list(MOVING)
    side = {i: -1.0 for i in UPPER_SIDE} | {i: 1.0 for i in LOWER_SIDE}
    sides = np.array([side.get(i, 0.0) for i in moving])
    q = tgt[moving].copy()
    for _ in range(8):
        q = src[moving] - field.at(q, sides)
    out = src.copy()
    out[moving] = q
    # the inner lips are where they were sent: each reads SEAM_MARGIN into its own lip,
    # so the inverse would put the lower one a hair above the upper one
    out[list(INNER_LIPS)] = tgt[list(INNER_LIPS)]
    return out
