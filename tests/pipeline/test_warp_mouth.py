"""The warp renderer on the smiling astronaut: teeth keep their colour, only the newly
opened gap is dark, the mouth's shape follows the sound, and it moves smoothly.

The sounds here are made (tones, formant vowels, noise bursts), not speech a recogniser
hears as phones, so the renderer reads loudness (`phones=False`): these tests are of
the warp, whichever cue opens it (the phones' are in test_mouth_visemes.py and the
referee's tests on espeak-ng's speech)."""

import cv2
import numpy as np
import pytest

from pipeline.render.audio import mouth_spread, spectral_centroid
from pipeline.render.renderers.warp import UPPER_SHARE, WarpRenderer, _lip_lines
from testkit.render_fixtures import FULL, build_assets, speech

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

SR = 48000
# CIE76 colour difference of the teeth's mean colour, rendered vs stored. Measured
# 0.2 (dlib points) to 1.7 (retinaface points) on the loudest frames; the renderer
# before this one, which darkened the whole inner mouth, gave 35-39.
TEETH_DELTA_E = 5.0


def vowel(formants, seconds=0.6, f0=140.0, sr=SR):
    """A steady voiced vowel: harmonics of f0 weighted by formant peaks."""
    t = np.arange(int(seconds * sr)) / sr
    h = np.arange(1, int(3800 / f0) + 1)
    gain = sum(np.exp(-(((h * f0 - f) / (0.12 * f + 60)) ** 2)) for f in formants) + 0.02
    return ((gain[:, None] / h[:, None]) * np.sin(2 * np.pi * h[:, None] * f0 * t)).sum(0)


OO = (300, 870, 2240)  # formants of "oo" (low centroid) ...
EE = (270, 2290, 3010)  # ... and of "ee" (high)


def lab(pixels):
    return cv2.cvtColor(pixels.reshape(-1, 1, 3).astype(np.uint8), cv2.COLOR_RGB2LAB).reshape(
        -1, 3
    ).astype(np.float64) * [100 / 255, 1, 1] - [0, 128, 128]


def upper_teeth(assets, idx):
    """(ys, xs) of the stored frame's upper teeth: bright pixels between the inner lips,
    in the share of the mouth that moves with the upper lip."""
    frame = assets.load_frame(idx)
    lm = assets.landmarks[idx]
    poly = np.zeros(frame.shape[:2], np.uint8)
    cv2.fillPoly(poly, [np.round(lm[60:68]).astype(np.int32)], 1)
    ys, xs = np.nonzero(poly)
    ua, ub, la, lb = _lip_lines(lm[60:68])  # frontal face: across ~ x, down ~ y
    top, bottom = np.interp(xs, ua, ub), np.interp(xs, la, lb)
    upper = ys < top + 0.8 * UPPER_SHARE * (bottom - top)
    bright = lab(frame[ys, xs])[:, 0] > 60
    keep = upper & bright
    return ys[keep], xs[keep]


@pytest.mark.parametrize("landmarker", ["retinaface", "dlib"])
def test_teeth_keep_their_colour_while_the_mouth_opens(landmarker):
    assets = build_assets(4, FULL, landmarker=landmarker)
    r = WarpRenderer(phones=False)
    r.prepare(assets, speech(3.0, SR, seed=3), SR, 75, 25.0)
    loud = [t for t in np.argsort(-r.openness())[:8] if r.openness()[t] > 0.5]
    assert len(loud) >= 4
    for t in loud:
        idx = int(t) % assets.n_frames
        frame = assets.load_frame(idx)
        ys, xs = upper_teeth(assets, idx)
        assert ys.size > 200  # the astronaut smiles: her upper teeth show
        plan = r._plan(idx)
        o, s = float(r.openness()[t]), float(r.shape()[t])
        out = r.render(int(t), idx, frame)
        # The upper lip's inner edge moves by ~1 px; follow it.
        lift = int(round(float((plan.moved_inner(o, s) - plan.inner)[1:4, 1].mean())))
        before, after = lab(frame[ys, xs]).mean(0), lab(out[ys + lift, xs]).mean(0)
        delta_e = float(np.linalg.norm(before - after))
        assert delta_e < TEETH_DELTA_E, f"t={t}: teeth ΔE {delta_e:.1f}"
        # ... and the mouth did open: below the teeth, a dark gap that was not there
        # (its darkest row between the lips: the tongue rises into its lower part)
        lm = plan.moved_inner(o, s)
        top, bottom = lm[[1, 2, 3], 1].mean(), lm[[5, 6, 7], 1].mean()
        cx = int(round(lm[[2, 6], 0].mean()))
        rows = range(int(round(0.6 * top + 0.4 * bottom)), int(round(0.2 * top + 0.8 * bottom)) + 1)
        dark = {y: lab(out[y, cx - 3 : cx + 4])[:, 0].mean() for y in rows}
        gap_y = min(dark, key=dark.get)
        assert dark[gap_y] < 30
        assert lab(frame[gap_y, cx - 3 : cx + 4])[:, 0].mean() > 45


def test_silence_and_the_stored_opening_draw_no_gap():
    """At openness 0 nothing changes; at a tiny openness the mouth barely moves and no
    dark pixel appears (the stored frame already shows that much mouth)."""
    assets = build_assets(4)
    r = WarpRenderer(phones=False)
    r.prepare(assets, speech(2.0, SR), SR, 50, 25.0)
    frame = assets.load_frame(1)
    r._open[:] = 0.0
    assert np.array_equal(r.render(0, 1, frame), frame)
    r._open[:] = 0.02
    out = r.render(0, 1, frame)
    # a sub-pixel move of the lower lip (0.02 x 0.24 of a 54 px lower face) across its edge
    assert np.abs(out.astype(int) - frame).max() <= 16
    assert lab(out[out.sum(-1) < 150]).shape[0] <= lab(frame[frame.sum(-1) < 150]).shape[0] + 3


def test_centroid_rounds_and_spreads_the_mouth():
    x = np.concatenate([vowel(OO), vowel(EE), vowel(OO), vowel(EE)])
    x = (x / np.abs(x).max() * 0.5).astype(np.float32)
    centroid = spectral_centroid(x, SR, 25.0)
    shape = mouth_spread(x, SR, 25.0)
    oo, ee = slice(5, 14), slice(20, 29)  # settled parts of the first "oo" and "ee"
    assert centroid[ee].mean() > 1.3 * centroid[oo].mean()
    assert (shape[oo] < -0.3).all() and (shape[ee] > 0.3).all()
    assert np.abs(np.diff(shape)).max() < 0.6  # no flicker between frames
    assert (mouth_spread(np.zeros(SR, np.float32), SR, 25.0) == 0).all()

    assets = build_assets(4, landmarker="retinaface")
    r = WarpRenderer(phones=False)
    r.prepare(assets, x, SR, shape.size, 25.0)
    plan = r._plan(0)

    def width(t):
        pts = plan.moved_inner(float(r.openness()[t]), float(r.shape()[t]))
        return float(np.linalg.norm(pts[4] - pts[0]))

    rest = float(np.linalg.norm(plan.inner[4] - plan.inner[0]))
    assert all(width(t) < rest - 1 for t in range(6, 14))  # "oo": corners in
    assert all(width(t) > rest + 1 for t in range(21, 29))  # "ee": corners out
    # The rendered frames differ by shape too, not only by loudness.
    t_oo, t_ee = 10, 25
    assert abs(r.openness()[t_oo] - r.openness()[t_ee]) < 0.15
    a, b = (r.render(t, 0, assets.load_frame(0)) for t in (t_oo, t_ee))
    assert np.abs(a.astype(int) - b).mean() > 0.05


def test_openness_is_smooth_at_25_fps():
    """The renderer's openness never jumps by more than 0.6 of its range in one frame
    (the raw envelope's attack is shorter than a frame)."""
    assets = build_assets(4)
    r = WarpRenderer(phones=False)
    r.prepare(assets, speech(4.0, SR, seed=5), SR, 100, 25.0)
    assert np.abs(np.diff(r.openness())).max() <= 0.6
    assert np.abs(np.diff(r.shape())).max() <= 0.6


@pytest.mark.parametrize("angle", [0, 30])
def test_the_mouth_opens_along_a_rolled_face(angle):
    """On a face rolled by `angle` degrees the lower lip moves down the face, not down
    the frame, and the gap still appears between the lips."""
    from skimage import data

    from pipeline.assets import AvatarAssets
    from pipeline.nets.detectors import load_detector
    from pipeline.nets.landmarks import load_landmarker
    from pipeline.precompile.crops import half_face_box
    from pipeline.precompile.masks import blend_square, landmark_mask

    m = cv2.getRotationMatrix2D((256, 256), angle, 1.0)
    frame = cv2.warpAffine(data.astronaut(), m, (512, 512), borderMode=cv2.BORDER_REFLECT)
    frame.flags.writeable = False
    box = load_detector("retinaface", None).detect([frame])[0][0, :4]
    lm = load_landmarker("retinaface", None).predict(frame, box)
    crop_box = half_face_box(lm, 0, frame.shape, box)
    square = blend_square(crop_box)
    assets = AvatarAssets(
        key=f"rolled-{angle}",
        fps=25.0,
        width=512,
        height=512,
        boxes=box[None],
        landmarks=lm[None],
        crop_boxes=crop_box[None],
        crops=None,
        mask_boxes=square[None],
        masks=landmark_mask(lm, crop_box, square)[None],
        load_frame=lambda i: frame,
    )
    r = WarpRenderer(phones=False)
    r.prepare(assets, vowel((730, 1090, 2440), 1.0).astype(np.float32) * 0.3, SR, 25, 25.0)
    plan = r._plan(0)
    move = plan.inner_move[6]  # point 66, middle of the lower inner lip
    down = np.degrees(np.arctan2(move[0], move[1]))  # 0 = straight down the frame
    # cv2 turns the picture anticlockwise by `angle`: the face's down turns towards +x.
    # Measured -1.7 and 24.1 degrees: the eye line of the fitted points, ~4 degrees off.
    assert abs(down - angle) < 8, f"lower lip moves at {down:.1f} deg, face rolled {angle}"
    assert np.linalg.norm(move) > 0.12 * plan.scale
    t = int(np.argmax(r.openness()))
    out = r.render(t, 0, frame)
    mid = plan.moved_inner(float(r.openness()[t]), float(r.shape()[t]))
    # the darkest point between the lips (the tongue rises into the gap's lower part)
    top, bottom = mid[[1, 2, 3]].mean(0), mid[[5, 6, 7]].mean(0)
    line = [(top + k * (bottom - top)).round().astype(int) for k in np.linspace(0.4, 0.8, 9)]
    gap = min(line, key=lambda p: lab(out[p[1], p[0]][None])[0, 0])
    assert lab(out[gap[1], gap[0]][None])[0, 0] < 35 < lab(frame[gap[1], gap[0]][None])[0, 0]
