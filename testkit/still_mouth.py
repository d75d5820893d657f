"""A still's mouth on real held-out footage: `python -m testkit.still_mouth [--open] [CLIP ...]`.

Per clip of testkit/footage/ (a presenter's, every one by default): the frames after its
first 60 % are held out as the truth; one of them is the persona's still (the frame whose
mouth the referee reads most shut, as bench/bench_mouth_real.py picks it, or with
`--open` the one nearest the held-out part's 75th percentile of lip gap: a still
photographed with its lips apart). The held-out part's own sound is rendered onto that
still through the real entry points (precompile of the PNG, `render_video`, the warp
renderer with the mouth library), and the referee (dlib, testkit/referee.py) reads the
lip gap (inner lips apart over the mouth's width) on every `step`-th frame of the render
and of the truth. Figures: the median and the narrowest tenth of each; the render's gap
on the frames its drive rests (silence and the phones' closures); the share of the
render's inside (the referee's inner-lip outline, frames open past OPEN) that is black
(Lab L under BLACK), against the truth's.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HOLD_OUT = 0.4
OPEN = 0.08  # lip gap: a frame whose inside the black share pools
BLACK = 12.0  # Lab L (0-100) under which an inside pixel counts as black


@dataclass
class StillMouth:
    name: str
    reason: str  # the still stage's (`lips apart`: it shut them)
    frames: int  # held-out frames rendered
    seconds: float
    still_gap: float  # the referee's gap on the still itself
    truth: np.ndarray  # referee gaps on the held-out truth (every step-th frame)
    render: np.ndarray  # ... on the render
    rest: np.ndarray  # the render's gaps where its drive asks for a shut mouth
    black_truth: float
    black_render: float

    def line(self) -> str:
        t, r = self.truth[np.isfinite(self.truth)], self.render[np.isfinite(self.render)]
        rest = self.rest[np.isfinite(self.rest)]
        return (
            f"{self.name}: {self.frames} frames ({self.seconds:.1f} s), {self.reason}, still gap "
            f"{self.still_gap:.3f}; median gap render {np.median(r):.3f} truth "
            f"{np.median(t):.3f} ({np.median(r) / np.median(t) - 1:+.0%}); narrowest tenth "
            f"render {np.quantile(r, 0.1):.3f} truth {np.quantile(t, 0.1):.3f}; at rest "
            f"({rest.size} frames) median {np.median(rest) if rest.size else np.nan:.3f}"
            f" max {rest.max() if rest.size else np.nan:.3f}; black inside render "
            f"{self.black_render:.1%} truth {self.black_truth:.1%}"
        )


def _black_share(frames: list[np.ndarray]) -> float:
    """Share of the pixels inside the referee's inner-lip outline that are black, over
    the frames open past OPEN."""
    import cv2

    from testkit.mouth_fixtures import lip_gap
    from testkit.referee import referee_points

    black = total = 0
    for f in frames:
        pts = referee_points(f)
        if pts is None or lip_gap(pts) <= OPEN:
            continue
        mask = np.zeros(f.shape[:2], np.uint8)
        cv2.fillPoly(mask, [np.round(pts[60:68]).astype(np.int32)], 1)
        lab = cv2.cvtColor(f.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)[mask > 0]
        black += int((lab[:, 0] < BLACK).sum())
        total += lab.shape[0]
    return black / total if total else float("nan")


def measure(
    name: str,
    tmp: Path,
    opened: bool = False,
    step: int = 2,
    seconds: float = 0.0,
    silence: float = 0.0,
) -> StillMouth:
    """Clip `name`'s held-out part rendered onto its still and read by the referee (the
    first `seconds` of the held-out part where given, then `silence` seconds of silence,
    judged at rest only)."""
    import cv2

    from cachestore.store import forget_store, open_store
    from hotplate.demo_data import write_wav
    from pipeline.hot import load_assets
    from pipeline.precompile.recipe import Recipe
    from pipeline.precompile.run import precompile
    from pipeline.render.video import render_video
    from testkit import footage
    from testkit.mouth_fixtures import asked_opening, referee_gaps, video_frames

    clip = footage.load(name)
    n = clip.frames.shape[0]
    split = int(round((1.0 - HOLD_OUT) * n))
    if seconds:
        n = min(n, split + int(round(seconds * clip.fps)))
    held = list(clip.frames[split:n])
    truth_all = referee_gaps(held)
    pick = np.where(np.isfinite(truth_all), truth_all, np.inf)
    if opened:
        target = np.nanquantile(truth_all, 0.75)
        still = held[int(np.argmin(np.abs(pick - target)))]
    else:
        still = held[int(np.argmin(pick))]
    png = tmp / f"{name}.png"
    cv2.imwrite(str(png), cv2.cvtColor(still, cv2.COLOR_RGB2BGR))
    sound = clip.audio[clip.samples_at(split) : clip.samples_at(n)]
    quiet = np.zeros(int(round(silence * clip.sr)), np.float32)
    wav = write_wav(tmp / f"{name}.wav", np.concatenate([sound, quiet]), clip.sr)
    store = open_store(tmp / f"store-{name}")
    try:
        assets = load_assets(store, precompile(png, Recipe(), store).avatar)
        out = render_video(assets, wav, tmp / f"{name}.mp4", fps=clip.fps).out_path
        made = video_frames(out)
        asked = asked_opening(assets, wav, len(made), clip.fps)
        record = store.get_stage(store.get_avatar(assets.key)["stages"]["still"])
    finally:
        forget_store(tmp / f"store-{name}")
    every = referee_gaps(made, step)
    rest = every[asked[::step][: every.size] <= 1e-3]
    made = made[: len(held)]
    gaps = every[: len(made[::step])]
    return StillMouth(
        name=name,
        reason=str(record.meta.get("reason")),
        frames=len(made),
        seconds=len(made) / clip.fps,
        still_gap=float(referee_gaps([still])[0]),
        truth=truth_all[::step][: gaps.size],
        render=gaps,
        rest=rest,
        black_truth=_black_share(held[::step]),
        black_render=_black_share(made[::step]),
    )


def main(argv: list[str]) -> None:
    from testkit import footage

    opened = "--open" in argv
    names = [a for a in argv if not a.startswith("--")] or [c.name for c in footage.presenters()]
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            print(measure(name, Path(d), opened).line(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])


def shut_assets(image: np.ndarray, box=None):
    """`mouth_fixtures.still_assets` of `image` as the still stage leaves it: with its lips
    shut where they were apart (`still.shut_rest`, `still_frame`), else as it is."""
    from dataclasses import replace

    from pipeline.precompile.still import rest_pose, shut_rest, still_frame
    from testkit.mouth_fixtures import still_assets

    assets = still_assets(image, "facemesh", box)
    rest = rest_pose(assets.landmarks)
    shut = None if rest is None else shut_rest(rest)
    got = None if shut is None else still_frame(image, assets.landmarks[0], shut)
    if got is None:
        return assets
    x1, y1, x2, y2 = got.box
    stilled = image.copy()
    stilled[y1:y2, x1:x2] = got.pixels
    stilled.flags.writeable = False
    return replace(assets, landmarks=got.landmarks[None], load_frame=lambda i: stilled)


def inside_lips(render: np.ndarray, lips: np.ndarray) -> float:
    """The share of the render's open mouth, as the referee reads it there (its inner-lip
    outline, 60-67, on `render`), inside the still's outer lips `lips` (48-59, the
    referee's on the photograph); nan where the referee finds no face or reads the
    render's mouth shut (a gap under 0.03 mouth widths: an outline with no inside)."""
    import cv2

    from testkit.mouth_fixtures import lip_gap
    from testkit.referee import referee_points

    pts = referee_points(render)
    if pts is None or lip_gap(pts) < 0.03:
        return float("nan")
    h, w = render.shape[:2]
    opening, outer = np.zeros((h, w), np.uint8), np.zeros((h, w), np.uint8)
    cv2.fillPoly(opening, [np.round(pts[60:68]).astype(np.int32)], 1)
    cv2.fillPoly(outer, [np.round(lips).astype(np.int32)], 1)
    inside = opening > 0
    return float((outer[inside] > 0).mean()) if inside.any() else float("nan")


def placements(variants: tuple[str, ...], names: tuple[str, ...] | None = None, seconds=3.0):
    """(sample name, median share by the referee, median share by the dark, median
    offset) of the library's opening on each test face (`testkit/faces.py`), on the
    frames a speech opens past 0.3: the share of the opening inside the photographed
    still's outer lips, the opening as the referee reads it on the render (`inside_lips`)
    and as `mouth_fixtures.opened` finds it in the image (the dark the render made, or
    left between the referee's inner lips; the library's teeth are not dark, so it sees
    only its cavity), and that dark's offset from the inner-lip line
    (`mouth_fixtures.placement`)."""
    from pipeline.render.renderers.warp import WarpRenderer
    from testkit import faces
    from testkit.mouth_fixtures import detect_box, opened, placement
    from testkit.render_fixtures import speech

    sr, n = 48000, int(25 * seconds)
    audio = speech(seconds, sr, seed=3)
    rows = []
    for s in faces.samples(names, variants):
        centre = (s.truth.min(0) + s.truth.max(0)) / 2
        assets = shut_assets(s.image, detect_box(s.image, centre))
        r = WarpRenderer()
        r.prepare(assets, audio, sr, n, 25.0)
        base = assets.load_frame(0)
        judged, shares, offsets = [], [], []
        for t in np.flatnonzero(r.openness() > 0.3)[::2]:
            out = r.render(int(t), 0, base)
            judged.append(inside_lips(out, s.truth[48:60]))
            offset, share = placement(opened(s.image, out, s.truth), s.truth)
            shares.append(share)
            offsets.append(offset)
        seen = np.asarray(judged)[np.isfinite(judged)]
        rows.append(
            (
                s.name,
                float(np.median(seen)) if seen.size else float("nan"),
                float(np.median(shares)),
                float(np.nanmedian(offsets)),
            )
        )
    return rows
