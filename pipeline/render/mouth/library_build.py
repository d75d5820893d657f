"""Build the default mouth library (`library.py`) from real talking footage.

    python -m pipeline.render.mouth.library_build VIDEO ... [--out NPZ] [--cache NPZ]
                                                  [--entries N] [--step K]

Every K-th frame of each video: RetinaFace's box, the face mesh's 68 points (the
renderer's own landmarker, so the library's mouth frame is the one the renderer
draws into), the inner mouth resampled into the mouth frame (u, v: `library.py`), the
mouth's shape (opening, inner width; canonical units), the lips ring's Lab stats and
the inner mouth's sharpness. Frames whose mouth is open past a slit are binned by
opening (equal shares of the frames); each bin keeps its sharpest frame of a narrower
and of a wider mouth. Deterministic: the same videos give the same file.

The per-frame extraction is cached (`--cache`): choosing entries again is instant.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipeline.render.mouth.library import (
    DATA,
    TEX,
    U_RANGE,
    V_RANGE,
    inner_shape,
    lips_stats,
)

MIN_OPENING = 0.05  # canonical units: a mouth open less than this is a slit, not kept
CAST = 6.0  # Lab b*: a frame whose lips are this much yellower than the median is cast


def mouth_texture(frame: np.ndarray, lm: np.ndarray) -> np.ndarray | None:
    """(*TEX, 3) uint8: the frame's inner mouth in the mouth frame (u, v)."""
    import cv2

    from pipeline.mouth.lips import to_canonical
    from pipeline.render.renderers.warp import _face_axes, _lip_lines

    axes = _face_axes(lm)
    origin = (lm[48] + lm[54]) / 2
    face = (lm[60:68] - origin) @ axes.T
    ua, ub, la, lb = _lip_lines(face)
    centre, half = (ua[0] + ua[-1]) / 2, (ua[-1] - ua[0]) / 2
    if half < 2.0:
        return None
    rows, cols = TEX
    u = U_RANGE[0] + (np.arange(cols) + 0.5) / cols * (U_RANGE[1] - U_RANGE[0])
    v = V_RANGE[0] + (np.arange(rows) + 0.5) / rows * (V_RANGE[1] - V_RANGE[0])
    a = centre + u * half
    top = np.interp(a, ua, ub)
    # v in canonical units (eye distances) down from the upper lip line at each u: the
    # teeth keep their real size whatever the opening, and nothing is stretched where
    # the gap narrows towards the corners
    unit = 1.0 / float(np.linalg.norm(to_canonical(lm.astype(np.float64))[0, :2]))
    b = top[None, :] + v[:, None] * unit
    aa = np.broadcast_to(a[None, :], b.shape)
    x = origin[0] + aa * axes[0, 0] + b * axes[1, 0]
    y = origin[1] + aa * axes[0, 1] + b * axes[1, 1]
    return cv2.remap(
        frame,
        x.astype(np.float32),
        y.astype(np.float32),
        cv2.INTER_CUBIC,
        borderMode=cv2.BORDER_REPLICATE,
    )


def teeth_end(texture: np.ndarray, opening: float) -> float:
    """v where the upper teeth end in a texture (0 where none show): down the middle
    third, the last row of the bright band under the upper lip, above the lower lip."""
    rows, cols = TEX
    mid = texture[:, cols // 3 : 2 * cols // 3].astype(np.float32)
    luma = mid @ np.array([0.299, 0.587, 0.114], np.float32)
    spread = mid.max(-1) - mid.min(-1)
    bright = ((luma > 110) & (spread < 70)).mean(1)  # share of tooth-like pixels per row
    v = V_RANGE[0] + (np.arange(rows) + 0.5) / rows * (V_RANGE[1] - V_RANGE[0])
    inside = (v > 0.0) & (v < 0.8 * opening)
    teeth = inside & (bright > 0.5)
    if not teeth.any():
        return 0.0
    return float(min(v[np.nonzero(teeth)[0].max()] + 0.01, 0.8 * opening))


def extract(videos: list[Path], step: int) -> dict[str, np.ndarray]:
    """Per kept frame: texture, shape, lips stats, sharpness, source (video, frame)."""
    import cv2

    from pipeline.media import make_proxy
    from pipeline.mouth.lips import to_canonical
    from pipeline.nets.detectors import load_detector
    from pipeline.nets.landmarks import load_landmarker

    detector = load_detector("retinaface", None)
    marker = load_landmarker("facemesh", None)
    got: dict[str, list] = {k: [] for k in ("textures", "shapes", "lips", "sharp", "source")}
    for vi, path in enumerate(videos):
        cap = cv2.VideoCapture(str(path))
        i = -1
        while True:
            ok, bgr = cap.read()
            if not ok:
                break
            i += 1
            if i % step:
                continue
            frame = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            small, scale = make_proxy(frame, 480)
            dets = detector.detect([small])[0]
            if len(dets) == 0:
                continue
            box = dets[int(np.argmax(dets[:, 4] if dets.shape[1] > 4 else dets[:, 2]))][:4]
            lm = np.asarray(marker.predict(frame, box / scale), np.float32)
            if not np.isfinite(lm).all():
                continue
            tex = mouth_texture(frame, lm)
            stats = lips_stats(frame, lm)
            if tex is None or stats is None:
                continue
            grey = cv2.cvtColor(tex, cv2.COLOR_RGB2GRAY).astype(np.float32)
            got["textures"].append(tex)
            got["shapes"].append(inner_shape(lm[60:68], to_canonical(lm.astype(np.float64))))
            got["lips"].append(stats[0])
            got["sharp"].append(float(cv2.Laplacian(grey, cv2.CV_32F).var()))
            got["source"].append((vi, i))
        cap.release()
        print(f"{path.name}: {i + 1} frames, {len(got['shapes'])} kept so far", flush=True)
    return {k: np.asarray(v) for k, v in got.items()}


def choose(frames: dict[str, np.ndarray], entries: int) -> np.ndarray:
    """Indices of the frames kept: per opening bin, the sharpest narrower and wider."""
    shapes = frames["shapes"]
    b = frames["lips"][:, 0, 2]
    cast = b > np.median(b) + CAST  # a video with another white balance
    open_ = np.nonzero((shapes[:, 0] >= MIN_OPENING) & ~cast)[0]
    bins = max(1, entries // 2)
    edges = np.quantile(shapes[open_, 0], np.linspace(0.0, 1.0, bins + 1))
    keep = []
    for b in range(bins):
        inb = open_[(shapes[open_, 0] >= edges[b]) & (shapes[open_, 0] <= edges[b + 1])]
        if inb.size == 0:
            continue
        wide = shapes[inb, 1] >= np.median(shapes[inb, 1])
        for part in (inb[~wide], inb[wide]):
            if part.size:
                keep.append(int(part[np.argmax(frames["sharp"][part])]))
    return np.array(sorted(set(keep)), np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("videos", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=DATA)
    ap.add_argument("--cache", type=Path, default=None, help="per-frame extraction, kept")
    ap.add_argument("--entries", type=int, default=32)
    ap.add_argument("--step", type=int, default=2, help="every STEP-th frame")
    args = ap.parse_args()
    videos = sorted(args.videos)
    if args.cache is not None and args.cache.is_file():
        with np.load(args.cache) as z:
            frames = {k: z[k] for k in z.files}
    else:
        frames = extract(videos, args.step)
        if args.cache is not None:
            np.savez(args.cache, **frames)
    keep = choose(frames, args.entries)
    tex = frames["textures"][keep]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out,
        textures=tex.astype(np.uint8),
        shapes=frames["shapes"][keep].astype(np.float32),
        lips=frames["lips"][keep].astype(np.float32),
        teeth=np.array(
            [teeth_end(t, o) for t, o in zip(tex, frames["shapes"][keep, 0], strict=True)],
            np.float32,
        ),
        source=np.array([f"{videos[v].name}#{i}" for v, i in frames["source"][keep]]),
    )
    print(f"{keep.size} entries from {len(frames['shapes'])} frames -> {args.out}")


if __name__ == "__main__":
    main()
