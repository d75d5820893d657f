"""A procedural mouth interior, for the gap that opens where the stored frame shows no
mouth (stills and loops that never talk, with no bank for the persona).

Drawn in the gap's own coordinates: u across (-1 at one corner, +1 at the other), v
down (0 at the upper inner lip, 1 at the lower), with the gap's height in px beside
them, so what has a real size (a tooth, the lip's wet inner edge) keeps it whatever the
opening. Back to front, as a real open mouth reads at 2x:

1. the cavity: nearly black in the face's own lip hue, darkest under the upper teeth
   and towards the corners (the cheeks' shadow), a little lighter low in the middle;
2. the tongue, a mound rising from behind the lower teeth once the mouth opens past a
   slit, lit on its crest, redder than the lips and darker than them, fading into the
   cavity towards the corners;
3. the lower teeth, their tops showing above the lower lip when the mouth is wide,
   in shadow;
4. the upper teeth under the upper lip, narrowing towards the corners (the arch turns
   away), with rounded biting edges and faint gaps, shaded into the corners' dark,
   unless the stored frame shows its own (the renderer moves those with the upper lip);
5. the lips' wet inner edges: a band of darkened lip along both lips (the top one
   shades the teeth's roots), so the blend from lip to mouth is soft, never a cut.

Colours come from the face (`Style.of`): the lips' mean colour and the skin's around
them set the hue and brightness of everything (a grey photo gets a grey mouth, a warm
light a warm one); the teeth are the stored frame's own where they show, else a
near-white in the skin's tint at the face's brightness. No colour is a constant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
# Brightness of each part, as a share of the skin's luma around the mouth (the face's
# light), or of the lips' where it is lip.
CAVITY = 0.2  # the darkest of the cavity, x skin
CAVITY_LIFT = 0.14  # ... lighter by up to this, low in the middle
TONGUE = (0.5, 0.78)  # tongue's luma x lips: its sides ... its lit crest
TONGUE_RED = 1.35  # the tongue's chroma x the lips' (redder, wetter)
TEETH = 1.5  # unlit teeth x skin luma (they sit in the mouth's shade) ...
TEETH_MAX = 240.0  # ... at most this
TEETH_TINT = 0.3  # share of the skin's tint in the teeth's colour
WALL = 0.82  # the lips' wet inner edge: lips x this, curling into the dark
CORNER = 0.72  # where the lips meet at the corners: lips x this
# Sizes, x the lower-face height (nose to chin, `scale`): real sizes, not gap shares.
UPPER_TEETH = 0.085  # upper teeth's height showing at the middle ...
UPPER_SHARE = 0.33  # ... at most this share of the gap
LOWER_TEETH = 0.035  # lower teeth's tops above the lower lip ...
LOWER_SHARE = 0.16  # ... at most this share of the gap
LOWER_FROM = (0.15, 0.06)  # gap height where the lower teeth start to show, and fade-in
TONGUE_FROM = (0.035, 0.05)  # ... and the tongue
TONGUE_RISE = 0.45  # the tongue's crest, share of the gap below the top at full height
TONGUE_TOP = 0.09  # ... and no higher than this x scale above the lower lip
TONGUE_HALF = 0.85  # its half-width, u units
SLIT = 0.045  # a gap under this is a slit (ends in lip at the corners)
WALL_PX = 0.07  # the lower lip's wet inner edge: its depth into the mouth ...
WALL_SHARE = 0.3  # ... at most this share of the gap (a narrow gap keeps its dark)
TOOTH = 0.36  # one central incisor's width, in arch units (u = sin(arch), see below)


@dataclass(frozen=True)
class Style:
    lips: np.ndarray  # (3,) float32 RGB, the lips' mean
    teeth: np.ndarray  # (3,) float32 RGB
    skin: np.ndarray  # (3,) float32 RGB, the skin's median around the mouth
    source_teeth: bool  # the stored frame shows its upper teeth: keep those, draw none

    @classmethod
    def of(cls, frame: np.ndarray, lm: np.ndarray) -> Style:
        """The colours of one stored frame's mouth, from its landmarks (68, 2); reads
        only the lips' box (`WarpRenderer.mouth_source` converts no more)."""
        import cv2

        h, w = frame.shape[:2]
        x1, y1 = np.floor(lm[48:60].min(0)).astype(int) - 2
        x2, y2 = np.ceil(lm[48:60].max(0)).astype(int) + 3
        x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, w), min(y2, h)
        if x2 <= x1 or y2 <= y1:  # no face to read: a neutral mid-grey one
            grey = np.full(3, 128.0, np.float32)
            return cls(grey * 0.8, grey * 1.6, grey, False)
        patch = frame[y1:y2, x1:x2].astype(np.float32)
        origin = np.array([x1, y1], np.float32)
        outer = np.zeros(patch.shape[:2], np.uint8)
        inner = np.zeros(patch.shape[:2], np.uint8)
        cv2.fillPoly(outer, [np.round(lm[48:60] - origin).astype(np.int32)], 1)
        cv2.fillPoly(inner, [np.round(lm[60:68] - origin).astype(np.int32)], 1)
        ring = (outer > 0) & (inner == 0)
        around = patch[outer == 0]
        skin = np.median(around, 0) if around.shape[0] > 8 else patch.reshape(-1, 3).mean(0)
        lips = patch[ring].mean(0) if ring.sum() > 8 else skin * 0.8
        between = patch[inner > 0]
        shown = False
        if between.size:
            luma = between @ LUMA
            bright = between[(luma > 140) & (between.max(1) - between.min(1) < 70)]
            if bright.shape[0] >= max(12, 0.15 * between.shape[0]):
                teeth, shown = bright.mean(0), True
        if not shown:
            teeth = tone(tint(skin, TEETH_TINT), min(TEETH * luma_of(skin), TEETH_MAX))
        f = np.float32
        return cls(lips.astype(f), np.asarray(teeth, f), np.asarray(skin, f), shown)


def luma_of(c: np.ndarray) -> float:
    return max(float(np.asarray(c, np.float32) @ LUMA), 1e-3)


def tone(c: np.ndarray, luma: float) -> np.ndarray:
    """Colour c brought to the given luma, its hue kept."""
    return (np.asarray(c, np.float32) * (luma / luma_of(c))).astype(np.float32)


def tint(c: np.ndarray, share: float) -> np.ndarray:
    """Colour c's chroma scaled by `share` (0: its grey, 1: itself, >1: more saturated)."""
    c = np.asarray(c, np.float32)
    grey = luma_of(c)
    return np.maximum(grey + share * (c - grey), 0.0).astype(np.float32)


def smooth_step(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _mix(colour: np.ndarray, over: np.ndarray, alpha: np.ndarray) -> None:
    """colour += (over - colour) * alpha, in place; `over` (3,) or (h, w, 3)."""
    colour += (over - colour) * alpha[..., None]


def paint(
    u: np.ndarray,
    v: np.ndarray,
    height: np.ndarray,
    style: Style,
    scale: float,
) -> np.ndarray:
    """(h, w, 3) float32 colours of the interior at gap coordinates u, v (h, w), where
    the gap is `height` px tall (h, w); `scale` is the lower-face height in px."""
    f = np.float32
    px = np.maximum(height, 1e-3).astype(f)
    skin_l = luma_of(style.skin)
    lips = style.lips
    below = (1.0 - v) * px  # px above the lower lip
    uu = u * u
    middle = 1.0 - uu  # 1 in the middle, 0 at the corners
    angle = np.arcsin(np.clip(u, -0.99, 0.99))  # along the teeth's arch (u is its sine)
    # 1. the cavity: darkest at the corners and under the top, lifted low in the middle
    dark = tone(tint(lips, 1.2), CAVITY * skin_l)
    lift = (CAVITY_LIFT / CAVITY) * middle * smooth_step(v * 1.6 - 0.4)
    colour = dark[None, None, :] * (0.55 + lift)[..., None]
    # 2. the tongue: a dome rising behind the lower teeth, its top highest in the middle
    # and meeting the lower lip towards the corners, lit on its crest
    opened = px / scale
    t_on = smooth_step((opened - TONGUE_FROM[0]) / TONGUE_FROM[1])
    crest = np.maximum(1.0 - TONGUE_RISE, 1.0 - TONGUE_TOP * scale / px)  # v of its top
    reach = np.minimum(np.abs(u) / TONGUE_HALF, 1.0)
    top = crest + (1.0 - crest) * reach * reach
    into = (v - top) * px  # px below the tongue's outline
    soft_px = max(0.03 * scale, 1.0)
    t_a = smooth_step(into / soft_px + 0.3) * t_on
    # shading of a dome: brightest just under its top in the middle
    dome = np.clip(1.0 - reach * reach, 0.0, 1.0) * smooth_step(
        1.0 - (into - soft_px) / (2.5 * soft_px)
    )
    lo, hi = TONGUE
    tongue = tone(tint(lips, TONGUE_RED), luma_of(lips))[None, None, :]
    _mix(colour, tongue * (lo + (hi - lo) * dome)[..., None], t_a)
    # 3. the lower teeth's tops above the lower lip, in shadow, once wide open
    l_on = smooth_step((opened - LOWER_FROM[0]) / LOWER_FROM[1])
    if float(l_on.max(initial=0.0)) > 0.0:
        band = np.minimum(LOWER_TEETH * scale, LOWER_SHARE * px) * (1.0 - 0.5 * uu)
        arch = angle / (0.8 * TOOTH)  # smaller teeth
        edge, gaps = _tooth_edges(arch)
        low_a = smooth_step((band - edge * 0.1 * band - below) / 1.2 + 0.5)
        low_a *= smooth_step((0.45 - np.abs(u)) / 0.2) * l_on
        shade = (0.85 - 0.45 * uu - 0.06 * gaps)[..., None]
        _mix(colour, style.teeth[None, None, :] * shade, low_a)
    # 4. the upper teeth under the upper lip
    if not style.source_teeth:
        # towards the corners the gap narrows and the teeth fill more of it (the cheeks
        # darken the rest), so the dark does not ring them
        share = UPPER_SHARE + (0.62 - UPPER_SHARE) * uu
        band = np.minimum(UPPER_TEETH * scale * (1.0 - 0.35 * uu), share * px)
        arch = angle / TOOTH
        edge, gaps = _tooth_edges(arch)
        depth = v * px  # px below the upper lip
        up_a = smooth_step((band - edge * 0.06 * band - depth) / max(1.2, 0.015 * scale) + 0.5)
        up_a *= smooth_step((1.0 - np.abs(u)) / 0.2) * smooth_step((px - 2.0) / 4.0)
        # lit in the middle, into shadow at the corners and at the roots (the upper half,
        # under the lip: a lit tooth against the seam's dark line read as drawn),
        # each tooth rounded (darker towards its neighbours) rather than outlined
        roots = smooth_step(1.0 - depth / (0.5 * band))
        shade = 1.0 - 0.3 * uu - 0.08 * edge - 0.04 * gaps - 0.3 * roots
        _mix(colour, style.teeth[None, None, :] * shade[..., None], up_a)
    # 5. the lips' wet inner edges, soft: darkened lip fading into the mouth
    # (the lip's lit rim at the lip line, curling down into the mouth's shade)
    wall_px = np.maximum(np.minimum(WALL_PX * scale, WALL_SHARE * px), 1.0)
    into_wall = np.clip(below / wall_px, 0.0, 1.0)
    wall = tone(lips, WALL * luma_of(lips))[None, None, :] * (1.0 - 0.35 * into_wall)[..., None]
    _mix(colour, wall, smooth_step(1.0 - into_wall) * 0.9)
    # the corners, where the lips meet: lip in shadow, not a black tip
    # (and where the gap is only a slit: its ends round off in lip, not a black tip)
    shut = np.maximum(smooth_step((np.abs(u) - 0.84) / 0.16), smooth_step(1.0 - opened / SLIT))
    _mix(colour, tone(lips, CORNER * luma_of(lips)), 0.9 * shut)
    return np.clip(colour, 0.0, 255.0, out=colour).astype(f, copy=False)


def _tooth_edges(arch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(notch, gap) at arch positions (teeth one unit wide, a gap at every integer):
    notch rises from 0 mid-tooth to 1 at a gap (the biting edges' rounded corners),
    gap is a thin line there (the dark between two teeth)."""
    d = np.abs(arch - np.round(arch))  # 0 at a gap, 0.5 mid-tooth
    notch = smooth_step((0.3 - d) / 0.3)
    gap = smooth_step((0.05 - d) / 0.05)
    return notch, gap
