"""Faces, speech and talking clips for the mouth tests, and the referee's measures.

- `still_assets(image, landmarks)`: a one-frame avatar of a real face image, built with
  the precompile's own pieces (RetinaFace's box on the detection proxy, the named
  landmarker, half-face crop, blend square, landmark mask): what a still's precompile
  stores, without a store;
- `espeak(text, path)`: speech from espeak-ng;
- `opening(source, rendered, ...)`: where a render opened the mouth (pixels made much
  darker), and its placement against the referee's lips: the centroid's offset from the
  inner-lip line and the share inside the lips, in mouth widths;
- `lip_gap(points)`: the referee's lip gap (inner lips apart, over the mouth's width).
"""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path

import numpy as np

from pipeline.assets import AvatarAssets
from testkit.preconditions import require

MASK_SIZE = 256
DARKER = 0.25  # a luma drop of this x the skin's brightness counts a pixel as opened ...
DARK = 0.5  # ... when it is also this dark against the skin around the mouth


def still_assets(image: np.ndarray, landmarks: str = "facemesh", box=None) -> AvatarAssets:
    """A one-frame avatar of `image` (RGB uint8) with the points of `landmarks`."""
    from pipeline.nets.landmarks import load_landmarker
    from pipeline.precompile.crops import half_face_box
    from pipeline.precompile.masks import blend_square, landmark_mask

    image = np.ascontiguousarray(image)
    image.flags.writeable = False
    if box is None:
        box = detect_box(image)
    lm = np.asarray(load_landmarker(landmarks, None).predict(image, box), np.float32)
    cb = half_face_box(lm, 0, image.shape, box)
    sq = blend_square(cb)
    mask = landmark_mask(lm, cb, sq, MASK_SIZE)
    h, w = image.shape[:2]
    return AvatarAssets(
        key=f"still-{landmarks}-{w}x{h}",
        fps=25.0,
        width=w,
        height=h,
        boxes=np.asarray([box], np.float32),
        landmarks=lm[None],
        crop_boxes=np.asarray([cb], np.int32),
        mask_boxes=np.asarray([sq], np.int32),
        masks=mask[None],
        load_frame=lambda i: image,
    )


@cache
def _detector():
    from pipeline.nets.detectors import load_detector

    return load_detector("retinaface", None)


def detect_box(image: np.ndarray, near: np.ndarray | None = None) -> np.ndarray:
    """RetinaFace's face box on the 480 px proxy, as tracking finds it (the face nearest
    `near`, a point, when several show)."""
    from pipeline.media import make_proxy

    small, scale = make_proxy(image, 480)
    dets = _detector().detect([small])[0]
    require(len(dets) > 0, "RetinaFace finds no face in the test image")
    boxes = dets[:, :4] / scale
    if near is None:
        return boxes[int(np.argmax((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])))]
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    return boxes[int(np.argmin(np.linalg.norm(centres - near, axis=1)))]


def espeak(text: str, path: Path, speed: int = 150) -> Path:
    """`text` spoken by espeak-ng into the WAV `path`."""
    exe = shutil.which("espeak-ng")
    require(
        exe is not None,
        "espeak-ng is not installed (apt-get install espeak-ng; `just setup` does it as root)",
    )
    subprocess.run([exe, "-s", str(speed), "-w", str(path), text], check=True)
    return path


SENTENCES = (
    "The quick brown fox jumps over the lazy dog. Peter Piper picked a peck of pickled "
    "peppers. How much wood would a woodchuck chuck. She sells sea shells by the sea shore."
)


def luma(rgb: np.ndarray) -> np.ndarray:
    return rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)


def mouth_width(points: np.ndarray) -> float:
    return float(np.linalg.norm(points[54] - points[48]))


def lip_gap(points: np.ndarray) -> float:
    """The inner lips' distance apart (pairs 61-67, 62-66, 63-65) over the mouth's width."""
    p = np.asarray(points, np.float64)
    gap = np.linalg.norm(p[[67, 66, 65]] - p[[61, 62, 63]], axis=1).mean()
    return float(gap / mouth_width(p))


def opened(source: np.ndarray, rendered: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(N, 2) x, y of the open mouth in a render, judged on the images and the referee's
    points alone: pixels near the mouth that are dark (under DARK x the skin's median
    brightness there: a mouth's interior, not a lip or a wrinkle that moved) and were
    made darker by DARKER x that, or were dark already between the referee's inner lips
    (a mouth the source shows open), the connected blob nearest the referee's mouth with
    something made darker in it."""
    import cv2

    p = np.asarray(points, np.float64)
    w = mouth_width(p)
    x1, y1 = np.floor(p[48:68].min(0) - w).astype(int)
    x2, y2 = np.ceil(p[48:68].max(0) + w).astype(int)
    h_, w_ = source.shape[:2]
    x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, w_), min(y2, h_)
    before, after = luma(source[y1:y2, x1:x2]), luma(rendered[y1:y2, x1:x2])
    skin = float(np.median(before))
    darker = (before - after) > DARKER * skin
    inner = np.zeros(before.shape, np.uint8)  # the source's own open mouth, if it shows one
    cv2.fillPoly(inner, [np.round(p[60:68] - [x1, y1]).astype(np.int32)], 1)
    dark = (after < DARK * skin) & (darker | ((before < DARK * skin) & (inner > 0)))
    n, labels = cv2.connectedComponents(dark.astype(np.uint8), connectivity=8)
    centre = p[60:68].mean(0) - [x1, y1]
    # every blob's size, whether it holds a darker pixel and its nearest pixel to the
    # mouth's centre, in one pass over the labelled pixels (a loop of `labels == k` per
    # blob cost most of test_mouth_placement's time on the large faces' many specks)
    ys, xs = np.nonzero(labels)
    label = labels[ys, xs]
    size = np.bincount(label, minlength=n)
    has_darker = np.bincount(label, weights=darker[ys, xs], minlength=n) > 0
    nearest = np.full(n, np.inf)
    np.minimum.at(nearest, label, np.hypot(xs - centre[0], ys - centre[1]))
    nearest[(size < 4) | ~has_darker] = np.inf
    nearest[0] = np.inf  # the background
    best = int(np.argmin(nearest)) if n > 1 else 0  # the first of equals, as before
    best_d = float(nearest[best])
    if best == 0 or best_d == np.inf or best_d > 0.5 * w:
        return np.zeros((0, 2))
    ys, xs = np.nonzero(labels == best)
    return np.stack([xs + x1, ys + y1], axis=1).astype(np.float64)


def placement(pixels: np.ndarray, points: np.ndarray) -> tuple[float, float]:
    """(offset, share) of an opening against the referee's lips: the centroid's distance
    from the inner-lip line (the midline between the upper and lower inner lip, +down
    the face), and the share of its pixels inside the outer lips (48-59), both in mouth
    widths / fractions. (nan, 0) when nothing opened."""
    import cv2

    if pixels.shape[0] == 0:
        return float("nan"), 0.0
    p = np.asarray(points, np.float64)
    w = mouth_width(p)
    across = (p[54] - p[48]) / w
    down = np.array([-across[1], across[0]])
    mid = (p[[61, 62, 63]] + p[[67, 66, 65]]) / 2  # the inner-lip line's middle points
    line = np.concatenate([p[[60]], mid, p[[64]]])
    c = pixels.mean(0)
    a = (line - p[48]) @ across
    b = (line - p[48]) @ down
    ca, cb = (c - p[48]) @ across, (c - p[48]) @ down
    offset = (cb - np.interp(ca, a, b)) / w
    lo = np.floor(np.minimum(pixels.min(0), p[48:60].min(0))).astype(int) - 1
    hi = np.ceil(np.maximum(pixels.max(0), p[48:60].max(0))).astype(int) + 2
    canvas = np.zeros((hi[1] - lo[1], hi[0] - lo[0]), np.uint8)
    cv2.fillPoly(canvas, [np.round(p[48:60] - lo).astype(np.int32)], 1)
    px = pixels.astype(int) - lo
    inside = canvas[px[:, 1], px[:, 0]] > 0
    return float(offset), float(inside.mean())


TALKING_RATE = 48000  # the talking clip's sound, Hz


def talking_clip(image: np.ndarray, wav: Path, out: Path, opening: float = 1.0) -> Path:
    """A talking clip made from a real face: `image` (a still, its mouth closed) speaking
    `wav` (espeak-ng), its mouth opened and closed by a known warp (the warp renderer's
    procedural mouth, no bank, opened by loudness: a clip whose mouth loudness opens, as
    the bank's tests need), H.264 and the speech as AAC. No real talking clip with its
    own audio ships in a package (testkit/faces_manifest.toml's clips have none).

    The clip is the image widened by its own edge to whole 64s on both sides: x264
    encoded 660x660 or 672x672 as another bitstream now and then, and the tests' figures
    moved with it; 704x704 came out the same every time (docs/notebook/mouth.md,
    "The talking clip is the same clip every run"). `opening`: `talking_frames`'."""
    from testkit.footage import write_clip

    h, w = image.shape[:2]
    top, left = (-h % 64) // 2, (-w % 64) // 2
    image = np.pad(image, ((top, -h % 64 - top), (left, -w % 64 - left), (0, 0)), "edge")
    frames, audio = talking_frames(image, wav, TALKING_RATE, opening)
    return write_clip(out, frames, audio, TALKING_RATE, 25.0)


def talking_frames(
    image: np.ndarray, wav: Path, sr: int, opening: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(frames (n, h, w, 3) at 25 fps, the speech at `sr`): `image` speaking `wav` as
    `talking_clip` shows it, before it is encoded. `opening`: the drive's opening times
    this (0.3: a presenter who barely opens the mouth while speaking, issue 62 item 2)."""
    from pipeline.render.audio import load_audio, n_video_frames
    from pipeline.render.renderers.warp import WarpRenderer

    audio = load_audio(wav, sr)
    n = n_video_frames(audio.size / sr, 25.0)
    # opened as the drive asks (still_curve 1): the known warp the bank's figures were set
    # on; a still's render since 524c81e opens at o ** 0.35, and the bank made from such
    # a clip reproduced it at r 0.738 against test_mouth_bank's 0.8
    r = WarpRenderer(phones=False, still_curve=1.0)
    r.prepare(still_assets(image), audio, sr, n, 25.0)
    r.openness()[:] *= opening  # the drive's own array: the frames below open that much
    return np.stack([r.render(t, 0, image) for t in range(n)]), audio


def asked_opening(assets, wav: Path, n: int, fps: float = 25.0) -> np.ndarray:
    """(n,) the opening a whole-file warp render of `wav` on `assets` asks the mouth for
    (its drive, by the phones): what the referee's lip gap on that render should follow
    where nothing else moves the mouth."""
    from pipeline.render.audio import load_audio
    from pipeline.render.renderers.warp import WarpRenderer

    r = WarpRenderer()
    r.prepare(assets, load_audio(wav, r.sample_rate), r.sample_rate, n, fps)
    return r.openness()


def video_frames(path: Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]


def referee_gaps(frames: list[np.ndarray], step: int = 1) -> np.ndarray:
    """The referee's lip gap on every `step`-th frame (nan where it finds no face)."""
    from testkit.referee import referee_points

    out = []
    for f in frames[::step]:
        pts = referee_points(f)
        out.append(np.nan if pts is None else lip_gap(pts))
    return np.asarray(out)


def ear_by_sentence(
    name: str, step: int = 1, sentences: int | None = None
) -> tuple[list[float], list[float]]:
    """Per joined sentence of footage clip `name` (several people's, testkit/footage):
    r of the ear's opening and of the phones' opening table (today's whole-file drive)
    against the referee's lip gap on every `step`-th frame, each sentence heard whole;
    the first `sentences` only, where given."""
    from pipeline.mouth.ear import load as load_ear
    from pipeline.mouth.visemes import phone_opening
    from testkit import footage

    got, ear = footage.load(name), load_ear()
    n = got.clip.sentence_frames
    if got.clip.people == 1 or n <= 0:
        raise ValueError(f"{name} is not a clip of several people's joined sentences")
    heard, told = [], []
    for k in list(range(0, got.frames.shape[0] - n + 1, n))[:sentences]:
        gaps = referee_gaps(list(got.frames[k : k + n]), step)
        audio = got.audio[got.samples_at(k) : got.samples_at(k + n)]
        heard.append(correlation(ear.openness(audio, got.sr, got.fps, n)[::step], gaps))
        told.append(correlation(phone_opening(audio, got.sr, got.fps, n)[::step], gaps))
    return heard, told


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r over the frames where both are known."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n = min(a.size, b.size)
    a, b = a[:n], b[:n]
    ok = np.isfinite(a) & np.isfinite(b)
    require(ok.sum() > 10, "the referee found too few faces to correlate")
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    err = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if err == 0 else 10.0 * np.log10(255.0**2 / err)
