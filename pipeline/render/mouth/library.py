"""The default mouth library: real mouth interiors for a face with no footage.

A still with no mouth bank opens its mouth where the stored frame shows none. Instead
of painting that interior (`interior.py`, the last fallback), the warp renderer samples
it from a few dozen real open mouths (teeth, tongue, cavity and the lips' wet inner
edge) filmed for the GRID corpus (CC BY 4.0; `data/mouth_library.toml` names the
sentences and the commit), shipped as package data (`data/mouth_library.npz`).

Each entry is one real frame's inner mouth resampled into the face mesh's mouth frame:
u across, -1 at one inner corner (60) and +1 at the other (64), v down from the upper
inner lip line in canonical units (eye distances; the lines are the renderer's own
parabolas through points 60-67, `warp._lip_lines`), so any entry fits any inner-lip
polygon with its teeth at their real size: a mouth open a little shows the teeth's
edges, a wide one the cavity and tongue under them (a render opening wider than its
entries stretches them down to its lower lip). Entries are
indexed by the mouth's shape in canonical units (the inner lips' opening and the inner
corners' distance, `inner_shape`).

At render (`LibraryMouth.colour`), per output frame:

1. the entries nearest the frame's shape, blended by Gaussian weights (a shape that
   moves smoothly gives a texture that changes smoothly: no jumps between entries);
2. the texture's colour matched to the face: per Lab channel, the entry's lips ring's
   mean and spread mapped onto the stored frame's (`FaceMatch.of`), so a grey photo
   gets a grey mouth and a warm light a warm one;
3. sampled at the gap's pixels (u, v), then the photo's grain (the skin's
   high-frequency noise around the mouth, which the library's upsampled pixels lack)
   added as a fixed noise field, so a still's mouth does not shimmer.

Built by `python -m pipeline.render.mouth.library build VIDEO ...`
(docs/notebook/mouth-library.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

DATA = Path(__file__).with_name("data") / "mouth_library.npz"
ENV = "HOTPLATE_MOUTH_LIBRARY"  # another library file, or "off": the painted interior
U_RANGE = (-1.1, 1.1)  # the texture's extent in mouth-frame units ...
V_RANGE = (-0.04, 0.26)  # ... and down from the upper lip line, canonical units
TEX = (48, 96)  # texture rows (v), columns (u)
SIGMA = (0.035, 0.08)  # blend widths over (opening, width), canonical units
NEAREST = 4  # entries blended per frame
GAIN_L = (0.6, 1.5)  # bounds of the colour match's contrast: L ...
GAIN_AB = (0.0, 1.6)  # ... and of a, b
GAIN_UP = (1.0, 3.0)  # ... and of L above the lips' (the teeth)
TEETH_L = 15.0  # the teeth's brightest: the skin's L plus this
TEETH_TINT = 0.25  # the teeth's tint: this share of the lips' (a, b)
LIP_EDGE = 0.02  # canonical v above which the texture turns to the face's lip colour
TONGUE = 0.6  # the tongue's back low in a wide cavity: the lips' colour x this
BITE = 1.0  # of an entry's opening, what its teeth fill: GRID's talker speaks with his
# teeth almost together, real speakers part them (a cavity shows at lesser openings)
PARTED = 0.04  # canonical units the teeth part by before the cavity between is dark
CAVITY = 0.35  # the cavity opened past the entries: at most this x the lips' luma
LOWER_TEETH = 0.35  # under a stored frame's own teeth: the lower teeth's share of the gap,
# at most (a laugh shows their tips over the lower lip; GRID's talker shows them whole)
LOWER_TOP = 0.02  # ... and no higher than this under the entries' upper lip line
TEETH_RAMP = 0.02  # canonical units the lower teeth fade into the cavity over
LOWER_CORNER = 0.6  # u from each corner over which the lower teeth fade out (0.35: a thin
# light line ran along the astronaut's gap to each corner, an outline at 2x)
WET_LIP = 0.8  # the lower lip's inner edge under the gap: the lips' colour x this
DEEP_WARM = 0.6  # under a stored frame's teeth, the cavity's share of the lips' hue ...
DEEP_TONGUE = 0.08  # ... the tongue's crest over the gap's floor (canonical) ...
DEEP_TONGUE_SHARE = 0.3  # ... at most this share of the gap's height ...
DEEP_TONGUE_EDGE = 0.025  # ... its top's softness ...
DEEP_TONGUE_HALF = 0.7  # ... its half-width, u units ...
DEEP_TONGUE_RED = 1.35  # ... and its chroma x the lips' (`deep_fill`; interior.py's)
GRAIN_MAX = 12.0  # the photo's grain added, at most this (8-bit units)
NOISE_SIZE = 256  # the fixed noise field's side, px


@dataclass(frozen=True)
class MouthLibrary:
    textures: np.ndarray  # (K, *TEX, 3) float32 RGB, 0-255
    shapes: np.ndarray  # (K, 2) float32 (opening, width), canonical units
    lips: np.ndarray  # (K, 2, 3) float32 the source lips ring's Lab mean and std
    teeth: np.ndarray  # (K,) float32 v where the upper teeth end (0: none show)
    path: Path

    @property
    def size(self) -> int:
        return int(self.shapes.shape[0])

    def weights(self, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(entries, weights) blended for a mouth shape (opening, width)."""
        d = (self.shapes - np.asarray(shape, np.float32)) / np.asarray(SIGMA, np.float32)
        d2 = (d * d).sum(1)
        order = np.argsort(d2, kind="stable")
        near = order[: min(NEAREST, self.size)]
        g = np.exp(-0.5 * (d2 - d2[order[0]]))
        # less the weight of the first entry left out, so an entry joins or leaves the
        # blend at weight 0 as the shape moves: no jump when the nearest set changes
        w = g[near] - (g[order[NEAREST]] if self.size > NEAREST else 0.0)
        w = np.maximum(w, 0.0) + 1e-6
        return near, (w / w.sum()).astype(np.float32)

    def blend(self, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(texture (*TEX, 3) RGB, lips Lab stats (2, 3), opening) for a mouth shape: its
        nearest entries' weighted mean."""
        near, w = self.weights(shape)
        tex = np.tensordot(w, self.textures[near], axes=1).astype(np.float32)
        lips = np.tensordot(w, self.lips[near], axes=1).astype(np.float32)
        return tex, lips, float(w @ self.shapes[near, 0])


def library_path() -> Path | None:
    """The library file a render reads (None: off, by `HOTPLATE_MOUTH_LIBRARY=off`)."""
    got = os.environ.get(ENV, "").strip()
    if got.lower() == "off":
        return None
    return Path(got) if got else DATA


def default_library() -> MouthLibrary | None:
    """The library, or None (then the interior is painted): off, or its file missing
    or unreadable, which logs one warning line naming it, once."""
    path = library_path()
    return None if path is None else _load(path)


@cache
def _load(path: Path) -> MouthLibrary | None:
    try:
        return read_library(path)
    except (OSError, ValueError, KeyError) as err:
        log.warning(
            "mouth library %s is unreadable (%s): mouths with no bank are painted;"
            " reinstall hotplate",
            path,
            err,
        )
        return None


def read_library(path: Path) -> MouthLibrary:
    """Read a library file (raises OSError or ValueError on a damaged one)."""
    with np.load(path, allow_pickle=False) as z:
        tex = z["textures"].astype(np.float32)
        shapes = z["shapes"].astype(np.float32)
        lips = z["lips"].astype(np.float32)
        teeth = z["teeth"].astype(np.float32)
    k = shapes.shape[0]
    if k == 0 or tex.shape != (k, *TEX, 3) or lips.shape != (k, 2, 3) or teeth.shape != (k,):
        raise ValueError(f"unexpected arrays {tex.shape}, {shapes.shape}, {lips.shape}")
    return MouthLibrary(tex, shapes, lips, teeth, path)


def mouth_kind(has_bank: bool, still: bool) -> str:
    """Which mouth a warp render shows: "bank", "library" (a still with no bank),
    "painted+library" (a loop with no bank: painted, but where a frame shows its own
    teeth the library's cavity and lower teeth under them) or "painted" (the library
    unreadable or off)."""
    if has_bank:
        return "bank"
    if default_library() is None:
        return "painted"
    return "library" if still else "painted+library"


INNER_PAIRS = ((61, 67), (62, 66), (63, 65))


def inner_shape(inner: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(opening, width) of inner lip points 60-67 (8, 2) in canonical units, by the
    face's canonical map m (2, 3): the gap between the inner lips and the distance
    between the inner corners."""
    c = np.asarray(inner, np.float64) @ m[:, :2].T + m[:, 2]
    gap = np.mean([c[lo - 60, 1] - c[up - 60, 1] for up, lo in INNER_PAIRS])
    return np.array([max(0.0, gap), np.linalg.norm(c[4] - c[0])], np.float32)


def lab(rgb: np.ndarray) -> np.ndarray:
    """float32 Lab (L 0-100) of RGB 0-255 pixels (..., 3)."""
    import cv2

    x = np.ascontiguousarray(np.asarray(rgb, np.float32).reshape(-1, 1, 3) / 255.0)
    return cv2.cvtColor(x, cv2.COLOR_RGB2Lab).reshape(np.shape(rgb))


def rgb_of(lab_px: np.ndarray) -> np.ndarray:
    import cv2

    x = np.ascontiguousarray(np.asarray(lab_px, np.float32).reshape(-1, 1, 3))
    return (cv2.cvtColor(x, cv2.COLOR_Lab2RGB) * 255.0).reshape(np.shape(lab_px))


def stats_box(lips: np.ndarray, width: int, height: int) -> tuple[int, int, int, int]:
    """The frame rectangle `lips_stats` reads around outer lip points 48-59 (12, 2)."""
    lips = np.asarray(lips, np.float32)
    pad = int(max(3, 0.3 * float(np.ptp(lips[:, 0]))))
    x1, y1 = (np.floor(lips.min(0)).astype(int) - pad).tolist()
    x2, y2 = (np.ceil(lips.max(0)).astype(int) + pad).tolist()
    return max(x1, 0), max(y1, 0), min(x2, width), min(y2, height)


def lips_stats(frame: np.ndarray, lm: np.ndarray) -> tuple[np.ndarray, float, float] | None:
    """((2, 3) Lab mean and std of the lips ring (outer lips 48-59 less the inner
    60-67), the skin's grain around the mouth (8-bit std of its high frequencies), the
    skin's median L there), from one frame's landmarks (68, 2); None where the lips
    cannot be read."""
    import cv2

    lips = np.asarray(lm[48:60], np.float32)
    x1, y1, x2, y2 = stats_box(lips, frame.shape[1], frame.shape[0])
    if x2 - x1 < 6 or y2 - y1 < 6:
        return None
    patch = frame[y1:y2, x1:x2]
    origin = np.array([x1, y1], np.float32)
    outer = np.zeros(patch.shape[:2], np.uint8)
    inner = np.zeros(patch.shape[:2], np.uint8)
    cv2.fillPoly(outer, [np.round(lips - origin).astype(np.int32)], 1)
    cv2.fillPoly(inner, [np.round(np.asarray(lm[60:68]) - origin).astype(np.int32)], 1)
    ring = (outer > 0) & (inner == 0)
    if ring.sum() < 8:
        return None
    px = lab(patch[ring])
    stats = np.stack([px.mean(0), np.maximum(px.std(0), 1.0)]).astype(np.float32)
    # grain: the skin around the lips less its own blur, robustly (MAD)
    grey = cv2.cvtColor(np.ascontiguousarray(patch), cv2.COLOR_RGB2GRAY).astype(np.float32)
    high = grey - cv2.GaussianBlur(grey, (0, 0), 1.5)
    skin = high[outer == 0]
    grain = float(1.4826 * np.median(np.abs(skin - np.median(skin)))) if skin.size > 16 else 0.0
    around = patch[outer == 0]
    skin_l = float(np.median(lab(around)[:, 0])) if around.shape[0] > 16 else float(stats[0, 0])
    return stats, grain, skin_l


@dataclass(frozen=True)
class FaceMatch:
    """What a stored frame's face gives the library's mouth: its lips' Lab stats, its
    grain, its canonical map."""

    lips: np.ndarray  # (2, 3) Lab mean and std of the lips ring
    grain: float
    canonical: np.ndarray  # (2, 3)
    skin: float  # the skin's median L around the mouth

    @classmethod
    def of(cls, frame: np.ndarray, lm: np.ndarray) -> FaceMatch | None:
        from pipeline.mouth.lips import to_canonical

        got = lips_stats(frame, lm)
        if got is None:
            return None
        return cls(got[0], got[1], to_canonical(np.asarray(lm, np.float64)), got[2])


@cache
def _noise() -> np.ndarray:
    """A fixed field of unit grain (px-scale, slightly soft as a sensor's is)."""
    import cv2

    rng = np.random.default_rng(46)
    n = rng.standard_normal((NOISE_SIZE, NOISE_SIZE)).astype(np.float32)
    n = cv2.GaussianBlur(n, (0, 0), 0.6)
    return n / max(float(n.std()), 1e-6)


def parting(tex: np.ndarray, opening: float) -> float:
    """v of the row where a texture `opening` open is darkest between its teeth, down
    its middle third: where the upper teeth meet the lower."""
    rows, cols = TEX
    dv = (V_RANGE[1] - V_RANGE[0]) / rows
    rv = V_RANGE[0] + (np.arange(rows) + 0.5) * dv
    mid = (tex @ np.array([0.299, 0.587, 0.114], np.float32))[:, cols // 3 : 2 * cols // 3]
    between = (rv > 0.45 * opening) & (rv < 0.8 * opening)
    return float(rv[between][np.argmin(mid.mean(1)[between])]) if between.any() else opening / 2


def cavity_colour(tex: np.ndarray, opening: float, darkest: float = 255.0) -> np.ndarray:
    """(3,) RGB of a texture's cavity: the darkest tenth of what is between its lips
    (less the corners), no lighter than luma `darkest` (GRID's talker barely parts his
    teeth: his darkest is often the shade between them, not a mouth's depth)."""
    rows, cols = TEX
    rv = V_RANGE[0] + (np.arange(rows) + 0.5) * (V_RANGE[1] - V_RANGE[0]) / rows
    luma_w = np.array([0.299, 0.587, 0.114], np.float32)
    inside = (rv > 0.0) & (rv < opening)
    px = tex[inside][:, cols // 8 : -cols // 8].reshape(-1, 3)
    cavity = px[np.argsort(px @ luma_w)[: max(8, px.shape[0] // 10)]].mean(0)
    return cavity * min(1.0, darkest / max(float(cavity @ luma_w), 1.0))


def cavity_fill(
    cavity: np.ndarray, u: np.ndarray, down: np.ndarray, tongue: np.ndarray | None
) -> np.ndarray:
    """(..., 3) the mouth's depth at u across (-1..1) and `down` (0 under the upper
    teeth to 1 at the lower teeth), broadcast together: darkest under the upper teeth and
    towards the corners (the cheeks' shade), lifted low in the middle towards the
    tongue's back (`tongue`, RGB)."""
    middle = np.clip(1.0 - u * u, 0.0, 1.0)[..., None]
    down = np.asarray(down, np.float32)[..., None]
    fill = cavity * (0.7 + 0.3 * middle) * (0.75 + 0.25 * down)
    if tongue is not None:
        lift = 0.5 * middle * down * down
        fill = fill + lift * (np.asarray(tongue, np.float32) - fill)
    return fill


def opened_to(
    tex: np.ndarray,
    height: float,
    opening: float,
    darkest: float = 255.0,
    tongue: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """(texture, its last row's v) of a texture `opening` open refitted to a mouth
    `height` open: the entries' upper teeth stay at the top and their lower teeth and
    lower lip's edge at the bottom, both at their real size, parted at the row where
    the texture is darkest between them (where they bite). A mouth open less than
    BITE x the entries loses the rows where their teeth overlap; one open more shows a
    cavity between them, shaded from the texture's own darkest colour (no lighter than
    luma `darkest`: GRID's talker barely parts his teeth) towards `tongue` low in the
    middle. (Stretched, the teeth read as long stripes; the parting row repeated, as
    grey bars; a flat dark band, as drawn.)"""
    rows, cols = TEX
    dv = (V_RANGE[1] - V_RANGE[0]) / rows
    split = parting(tex, opening)
    bite = BITE * opening
    if height <= bite:
        cut, extra = opening - max(height, 0.0), 0.0
    else:
        cut, extra = opening - bite, height - bite
    v_end = max(height, 0.0) + (V_RANGE[1] - opening)
    n = max(int(np.ceil((v_end - V_RANGE[0]) / dv)), 2)
    ev = V_RANGE[0] + (np.arange(n) + 0.5) * dv
    src = np.where(ev <= split, ev, np.where(ev >= split + extra, ev - extra + cut, split))
    at = np.clip((src - V_RANGE[0]) / dv - 0.5, 0.0, rows - 1.0)
    lo = np.floor(at).astype(int)
    hi = np.minimum(lo + 1, rows - 1)
    f = (at - lo)[:, None, None].astype(np.float32)
    out = tex[lo] * (1.0 - f) + tex[hi] * f
    if extra > 0.0:
        ramp = max(min(0.02, extra / 2), 1e-3)
        into = np.minimum(ev - split, split + extra - ev)  # canonical units into the cavity
        c = np.clip(into / ramp, 0.0, 1.0)
        # a cavity only where the teeth part enough to show one: a thin parting stays
        # the entries' own (forced dark, it read as a drawn black line across the teeth)
        c = c * c * (3.0 - 2.0 * c) * float(np.clip(extra / PARTED, 0.0, 1.0))
        down = np.clip((ev - split) / max(extra, 1e-3), 0.0, 1.0)[:, None]
        u = np.linspace(U_RANGE[0], U_RANGE[1], cols)[None, :]
        fill = cavity_fill(cavity_colour(tex, opening, darkest), u, down, tongue)
        out = out * (1.0 - c)[:, None, None] + fill * c[:, None, None]
    return out.astype(np.float32), V_RANGE[0] + n * dv


_TILED: list[np.ndarray] = []


def _tiled(h: int, w: int) -> np.ndarray:
    """The noise field tiled to at least (h, w), kept (a tile per frame cost ~0.5 ms)."""
    if not _TILED or _TILED[0].shape[0] < h or _TILED[0].shape[1] < w:
        reps = (h // NOISE_SIZE + 1, w // NOISE_SIZE + 1)
        _TILED[:] = [np.tile(_noise(), reps)]
    return _TILED[0]


def matched(texture: np.ndarray, source: np.ndarray, face: FaceMatch) -> np.ndarray:
    """The texture (*TEX, 3) RGB recoloured from the source lips' Lab stats (2, 3) to
    the face's: lightness by mean and spread (the teeth stay as much lighter than the
    lips as they were), a and b in proportion to the lips' (a grey photo's lips have
    none: its mouth turns grey; a warm light's yellower lips make yellower teeth). (A
    mean shift of a and b left the source's teeth-to-lips difference in: cyan teeth
    in a grey photo.)"""
    t = lab(texture)
    gain = np.clip(face.lips[1, 0] / source[1, 0], *GAIN_L)
    # above the lips' lightness, the teeth: their brightest brought to the face's skin
    # plus TEETH_L (GRID's MPEG-1 frames dulled them: grey teeth beside the truth's white)
    top = float(np.quantile(t[..., 0], 0.97)) - source[0, 0]
    up = np.clip((min(face.skin + TEETH_L, 95.0) - face.lips[0, 0]) / max(top, 1.0), *GAIN_UP)
    d = t[..., 0] - source[0, 0]
    t[..., 0] = np.clip(np.where(d > 0, d * up, d * gain) + face.lips[0, 0], 0.0, 100.0)
    ratio = face.lips[0, 1:] / np.where(np.abs(source[0, 1:]) > 1.0, source[0, 1:], 1.0)
    t[..., 1:] *= np.clip(ratio, *GAIN_AB)
    # what is much lighter than the lips (the teeth) takes a share of the lips' tint,
    # not its own: GRID's teeth are green-yellow (a* below 0), which no lip ratio fixes
    light = np.clip((t[..., 0] - face.lips[0, 0]) / 20.0, 0.0, 1.0)[..., None]
    t[..., 1:] = t[..., 1:] * (1.0 - light) + light * TEETH_TINT * face.lips[0, 1:]
    return np.clip(rgb_of(t), 0.0, 255.0)


def _sample(tex: np.ndarray, u: np.ndarray, v: np.ndarray, v_end: float) -> np.ndarray:
    """(h, w, 3) a texture whose rows run V_RANGE[0]..v_end read at u, v (h, w)."""
    import cv2

    rows, cols = tex.shape[:2]
    mx = (u - U_RANGE[0]) / (U_RANGE[1] - U_RANGE[0]) * cols - 0.5
    my = (v - V_RANGE[0]) / (v_end - V_RANGE[0]) * rows - 0.5
    return cv2.remap(
        np.ascontiguousarray(tex, np.float32),
        mx.astype(np.float32),
        my.astype(np.float32),
        cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_REPLICATE,
    )


def deep_fill(
    cavity: np.ndarray,
    lips: np.ndarray,
    u: np.ndarray,
    down: np.ndarray,
    above: np.ndarray,
    height: np.ndarray,
) -> np.ndarray:
    """(h, w, 3) the mouth's depth under a stored frame's own upper teeth, at u across
    (-1..1), `down` (0 under the teeth to 1 at the lower teeth) and `above` the gap's
    lower edge (canonical units), in a gap `height` tall: the cavity (the library's
    darkest, warmed towards the lips' hue: a mouth's inside is a dark red, not the grey
    GRID's compressed frames give), in the teeth's shadow at the top and the cheeks'
    towards the corners; and the tongue's back, a low dome on the gap's floor in the
    middle (DEEP_TONGUE, at most DEEP_TONGUE_SHARE of the gap), redder than the lips and
    lit on its crest. (The cavity's smooth ramp alone read as a flat grey crescent
    between the astronaut's teeth at 2x.)"""
    luma_w = np.array([0.299, 0.587, 0.114], np.float32)
    cav = np.asarray(cavity, np.float32)
    warm = lips * (float(cav @ luma_w) / max(float(lips @ luma_w), 1.0))
    cav = cav + DEEP_WARM * (warm - cav)
    middle = np.clip(1.0 - u * u, 0.0, 1.0)[..., None]
    shade = (0.45 + 0.55 * smooth(down / 0.6))[..., None] * (0.6 + 0.4 * middle)
    out = cav * shade
    grey = float(lips @ luma_w)
    red = grey + DEEP_TONGUE_RED * (lips - grey)
    # its top a low dome across the middle, as deep below the gap's top everywhere as
    # at the gap's tallest, less its rise: where the gap thins towards the corners it
    # hides the tongue (drawn along the lower edge instead, it read as a red stripe)
    tall = float(height.max(initial=0.0))
    hump = np.clip(1.0 - (u / DEEP_TONGUE_HALF) ** 2, 0.0, 1.0)
    rise = min(DEEP_TONGUE, DEEP_TONGUE_SHARE * tall) * hump
    below = height - above  # under the gap's top
    depth = below - (tall - rise)  # into the tongue, from its top
    on = smooth(depth / DEEP_TONGUE_EDGE + 0.5) * (hump > 0.0)
    crest = np.clip(1.0 - depth / max(float(rise.max(initial=0.0)), 1e-3), 0.0, 1.0)
    tongue = red * (0.4 + 0.22 * crest)[..., None] * (0.7 + 0.3 * middle)
    return out + on[..., None] * (tongue - out)


def smooth(x: np.ndarray) -> np.ndarray:
    """0 to 1 over x in [0, 1], flat at both ends (smoothstep)."""
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def under_teeth(
    tex: np.ndarray,
    opening: float,
    u: np.ndarray,
    below: np.ndarray,
    above: np.ndarray,
    darkest: float,
    lips: np.ndarray,
) -> np.ndarray:
    """(h, w, 3) what opens under a stored frame's own upper teeth, at u across and
    `below` its top, `above` its lower edge (canonical units, (h, w) each): the cavity,
    and the entries' lower teeth rising from behind the lower lip, read up from their
    lower inner lip (`opening`) at their real size over at most LOWER_TEETH of the gap's
    height there; under the gap's lower edge, the face's lips (`lips`, RGB: what the
    renderer lifts the lower lip's dark rim towards). (Read down from the entries'
    parting instead, their lower teeth sat under the lower lip and the gap showed only
    cavity: the demo's astronaut opened a flat dark crescent under her teeth.)"""
    height = np.maximum(below + above, 0.0)
    # towards the corners the cheeks' shade hides the lower teeth (left in, a thin light
    # line ran along the gap's lower edge to each corner)
    corner = np.clip((1.0 - np.abs(u)) / LOWER_CORNER, 0.0, 1.0)
    band = np.minimum(LOWER_TEETH * height, max(opening - LOWER_TOP, 0.0)) * corner
    teeth = _sample(tex, u, opening - above, V_RANGE[1])
    down = np.clip(below / np.maximum(height - band, 1e-3), 0.0, 1.0)
    fill = deep_fill(cavity_colour(tex, opening, darkest), lips, u, down, above - band, height)
    w = np.clip((band - above) / TEETH_RAMP + 0.5, 0.0, 1.0)
    out = fill + (w * w * (3.0 - 2.0 * w))[..., None] * (teeth - fill)
    # the lower lip's wet inner edge, darker than its outside (the lips' own colour
    # there read as a light outline round the gap at 2x)
    lip = np.clip(-above / TEETH_RAMP, 0.0, 1.0)[..., None]
    return out + lip * (WET_LIP * lips - out)


class LibraryMouth:
    """The library's interior for one render: `colour(...)` per output frame."""

    def __init__(self, library: MouthLibrary) -> None:
        self.library = library
        self._faces: dict[int, FaceMatch | None] = {}

    def face(self, idx: int, frame: np.ndarray, lm: np.ndarray) -> FaceMatch | None:
        if idx not in self._faces:
            self._faces[idx] = FaceMatch.of(frame, lm)
        return self._faces[idx]

    def colour(
        self,
        face: FaceMatch,
        inner: np.ndarray,
        u: np.ndarray,
        depth: np.ndarray,
        below_gap: np.ndarray,
        above_gap: np.ndarray | None,
        at: tuple[int, int],
    ) -> np.ndarray:
        """(h, w, 3) float32 RGB of pixels at u (h, w) across the mouth and `depth` px
        below its upper inner lip line, for a mouth whose inner lip points (8, 2) are
        `inner`. Where the stored frame shows its own upper teeth, `above_gap` (px above
        the gap's lower edge; None where it shows none) and `below_gap` (px below the
        gap's top) place what opens under them (`under_teeth`). `at`: the pixels' frame
        position (the grain is fixed there)."""
        shape = inner_shape(inner, face.canonical)
        tex, source, opening = self.library.blend(shape)
        tex = matched(tex, source, face)
        unit = float(np.linalg.norm(face.canonical[0, :2]))  # canonical units per px
        lips = rgb_of(face.lips[0][None])[0]
        darkest = CAVITY * float(lips @ np.array([0.299, 0.587, 0.114], np.float32))
        if above_gap is not None:
            out = under_teeth(tex, opening, u, below_gap * unit, above_gap * unit, darkest, lips)
        else:
            # the upper lip's inner edge is the face's lip: the entries' top rows hold
            # the shadow under GRID's upper lip, which on another face's lip line read
            # as a dark outline over the teeth
            rows = tex.shape[0]
            rv = V_RANGE[0] + (np.arange(rows) + 0.5) / rows * (V_RANGE[1] - V_RANGE[0])
            lip = np.clip((LIP_EDGE - rv) / (LIP_EDGE - V_RANGE[0]), 0.0, 1.0)[:, None, None]
            tex = tex * (1.0 - lip) + lips[None, None, :] * lip
            tex, v_end = opened_to(tex, float(shape[0]), opening, darkest, lips * TONGUE)
            out = _sample(tex, u, depth * unit, v_end)
        grain = min(face.grain, GRAIN_MAX)
        if grain > 0.3:
            h, w = u.shape
            x0, y0 = at[0] % NOISE_SIZE, at[1] % NOISE_SIZE
            n = _tiled(h + y0, w + x0)
            out += grain * n[y0 : y0 + h, x0 : x0 + w, None]
        return np.clip(out, 0.0, 255.0)
