"""A procedural mouth interior, for the gap that opens where the stored frame shows no
mouth (stills and loops that never talk, with no bank for the persona).

Drawn in the gap's own coordinates: u across (-1 at one corner, +1 at the other), v
down (0 at the upper inner lip, 1 at the lower). Back to front:

1. the cavity, the lips' colour darkened, darkest deep in the middle and lighter
   towards the lips (shading that falls off with depth), the inner lip walls a soft
   band of darkened lip at the top and bottom edges, never a flat fill;
2. the tongue, a lit mound rising from the bottom, in the lips' hue;
3. a hint of the lower teeth behind the lower lip, in shadow, once the mouth is open
   enough to show them;
4. the upper teeth under the upper lip, with faint gaps between them, unless the
   stored frame shows its own upper teeth (the renderer moves those with the upper lip).

Colours come from the face (`Style.of`): the lips' mean colour, the teeth's when they
show, else an off-white at the face's brightness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_TEETH = np.array([226.0, 220.0, 206.0], np.float32)
CAVITY = np.array([0.42, 0.22, 0.24], np.float32)  # the cavity: the lips' colour, redder ...
DEPTH_DARK = 0.55  # ... and this much darker again deep inside
WALL = 0.14  # inner lip walls: this share of the gap's height at each edge
TONGUE = (0.62, 0.42, 1.02)  # radius across, radius down, centre down (u, v units)
UPPER_TEETH = 0.3  # share of the gap's height the upper teeth take at most ...
UPPER_TEETH_SCALE = 0.085  # ... and at most this x lower-face height
TOOTH = 0.17  # one tooth's width, u units (incisors in the middle)
LOWER_TEETH = 0.16  # share of the gap the hint of the lower teeth takes
LOWER_TEETH_FROM = 8.0  # px of gap before the lower teeth show at all


@dataclass(frozen=True)
class Style:
    lips: np.ndarray  # (3,) float32 RGB
    teeth: np.ndarray  # (3,) float32 RGB
    source_teeth: bool  # the stored frame shows its upper teeth: keep those, draw none

    @classmethod
    def of(cls, frame: np.ndarray, lm: np.ndarray) -> Style:
        """The colours of one stored frame's mouth, from its landmarks (68, 2)."""
        import cv2

        h, w = frame.shape[:2]
        x1, y1 = np.floor(lm[48:60].min(0)).astype(int) - 2
        x2, y2 = np.ceil(lm[48:60].max(0)).astype(int) + 3
        x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, w), min(y2, h)
        if x2 <= x1 or y2 <= y1:
            return cls(np.array([150.0, 80.0, 80.0], np.float32), DEFAULT_TEETH, False)
        patch = frame[y1:y2, x1:x2].astype(np.float32)
        origin = np.array([x1, y1], np.float32)
        outer = np.zeros(patch.shape[:2], np.uint8)
        inner = np.zeros(patch.shape[:2], np.uint8)
        cv2.fillPoly(outer, [np.round(lm[48:60] - origin).astype(np.int32)], 1)
        cv2.fillPoly(inner, [np.round(lm[60:68] - origin).astype(np.int32)], 1)
        ring = (outer > 0) & (inner == 0)
        lips = patch[ring].mean(0) if ring.sum() > 8 else np.array([150.0, 80.0, 80.0])
        between = patch[inner > 0]
        teeth, shown = DEFAULT_TEETH, False
        if between.size:
            luma = between @ np.array([0.299, 0.587, 0.114], np.float32)
            bright = between[(luma > 140) & (between.max(1) - between.min(1) < 70)]
            if bright.shape[0] >= max(12, 0.15 * between.shape[0]):
                teeth, shown = bright.mean(0), True
        if not shown:  # an off-white as bright as the face around the mouth
            skin = float(np.median(patch[outer == 0] @ np.array([0.299, 0.587, 0.114])))
            teeth = DEFAULT_TEETH * float(np.clip(skin / 165.0, 0.7, 1.05))
        return cls(lips.astype(np.float32), np.asarray(teeth, np.float32), shown)


def smooth_step(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def paint(
    u: np.ndarray,
    v: np.ndarray,
    height: np.ndarray,
    style: Style,
    scale: float,
) -> np.ndarray:
    """(h, w, 3) float32 colours of the interior at gap coordinates u, v (h, w), where
    the gap is `height` px tall; `scale` is the lower-face height in px."""
    lips = style.lips
    px = np.maximum(height, 1e-3)
    # 1. cavity: dark, darker with depth, the lip walls lighter at the edges
    depth = np.clip(1.0 - u * u, 0.0, 1.0) * np.clip(4.0 * v * (1.0 - v), 0.0, 1.0)
    shade = 1.0 - DEPTH_DARK * depth
    colour = (lips * CAVITY)[None, None, :] * shade[..., None]
    wall = np.maximum(smooth_step(1.0 - v / WALL), smooth_step(1.0 - (1.0 - v) / WALL))
    colour += (lips * np.array([0.62, 0.42, 0.44], np.float32) - colour) * (0.7 * wall)[..., None]
    # 2. the tongue, lit on its crest, fading into the cavity at its edge
    ru, rv, cv = TONGUE
    r2 = (u / ru) ** 2 + ((v - cv) / rv) ** 2
    tongue_a = smooth_step((1.0 - r2) / 0.35) * smooth_step((px - 3.0) / 6.0)
    crest = np.clip(1.0 - (v - (cv - rv)) / (1.2 * rv), 0.0, 1.0)
    tongue = lips * np.array([0.82, 0.6, 0.64], np.float32)
    tongue_c = tongue[None, None, :] * (0.45 + 0.4 * crest)[..., None]
    colour += (tongue_c - colour) * tongue_a[..., None]
    # 3. a hint of the lower teeth, in shadow, behind the lower lip
    low = smooth_step((v - (1.0 - LOWER_TEETH)) / 0.06) * smooth_step((0.55 - np.abs(u)) / 0.15)
    low *= 0.45 * smooth_step((px - LOWER_TEETH_FROM) / 8.0)
    colour += (style.teeth * 0.5 - colour) * low[..., None]
    # 4. the upper teeth, unless the stored frame shows its own
    if not style.source_teeth:
        band = np.minimum(UPPER_TEETH, UPPER_TEETH_SCALE * scale / px)
        edge = smooth_step((band - v) / np.maximum(0.25 * band, 1e-3))
        across = smooth_step((0.78 - np.abs(u)) / 0.2)
        gaps = np.cos(np.pi * u / TOOTH) ** 40  # a thin dark line between two teeth
        lit = (0.92 - 0.35 * u * u - 0.15 * gaps)[..., None]
        upper = edge * across * smooth_step((px - 2.0) / 4.0)
        colour += (style.teeth[None, None, :] * lit - colour) * upper[..., None]
    return colour.astype(np.float32)
