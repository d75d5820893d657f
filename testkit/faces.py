"""The test faces: real faces read from installed packages, and variants made in code.

`faces_manifest.toml` beside this file lists each source (the package that ships it, the path
inside it, where the face comes from, its licence). Nothing but that list is committed:
the files are read where `just setup` installed them (pip's dev extra, Debian's packages).

`samples()` returns the faces the landmark tests and benches judge: every still and the
listed video frames, each as it is and in variants (roll up to 30 degrees, faces 150 to
1000 px tall, dark and warm light, OpenCV's stylization). Each sample carries the
referee's 68 points (`testkit/referee.py`, dlib's predictor), measured once on the
upright source and carried through the variant's known transform, so a rolled or
stylized face is judged against where its points really are, not against what the
referee makes of the variant.

`clip(name)` returns a whole talking clip (frames and fps) for tests that need motion.
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from testkit.preconditions import require

MANIFEST = Path(__file__).with_name("faces_manifest.toml")

# (name, roll in degrees, face height in px (brows to chin, the referee's points), light, style)
VARIANTS: tuple[tuple[str, float, float, str, str], ...] = (
    ("upright", 0.0, 300.0, "", ""),
    ("roll+15", 15.0, 250.0, "", ""),
    ("roll-30", -30.0, 400.0, "", ""),
    ("small", 0.0, 150.0, "", ""),
    ("large", 8.0, 1000.0, "", ""),
    ("dark", 0.0, 300.0, "dark", ""),
    ("warm", -10.0, 300.0, "warm", ""),
    ("stylized", 0.0, 300.0, "", "stylized"),
)
CONTEXT = 2.2  # canvas side / face height: the face with its head and some background


@dataclass(frozen=True)
class Source:
    name: str
    package: str  # a pip distribution, or "deb:NAME" for a Debian package
    path: str  # inside the package's import directory (pip), absolute (deb)
    kind: str  # photo, cg, video
    origin: str
    licence: str
    face: str = ""  # "x,y" fractions of the image: which face, where several show
    frames: tuple[int, ...] = ()


@dataclass(frozen=True)
class Sample:
    """One face to judge: an RGB image and the referee's points on it."""

    name: str  # "<source>/<variant>", "<source>@<frame>/<variant>" for video frames
    source: Source
    variant: str
    image: np.ndarray  # (H, W, 3) uint8 RGB
    truth: np.ndarray  # (68, 2) float64: the referee's points, carried through the variant
    face_height: float  # px, brows to chin


@cache
def sources() -> tuple[Source, ...]:
    data = tomllib.loads(MANIFEST.read_text())
    return tuple(Source(**{**f, "frames": tuple(f.get("frames", ()))}) for f in data["face"])


def source(name: str) -> Source:
    for s in sources():
        if s.name == name:
            return s
    raise KeyError(f"no test face {name!r} in {MANIFEST}")


def source_file(src: Source) -> Path:
    """Where the installed package holds the source file (a test needing it skips, or
    fails under CI, when the package is missing)."""
    if src.package.startswith("deb:"):
        path = Path(src.path)
        # the quick tier (tests/quick_tier.py) runs as a machine with no Debian package
        there = path.is_file() and not os.environ.get("HOTPLATE_NO_DEBIAN_FILES")
        require(there, f"{path} missing: apt-get install {src.package[4:]} (`just setup`)")
        return path
    top = src.path.split("/", 1)[0]
    spec = importlib.util.find_spec(top)  # finds the directory without importing it
    require(
        spec is not None and spec.submodule_search_locations,
        f"test face {src.name}: pip package {src.package} is not installed (`just setup`)",
    )
    path = Path(next(iter(spec.submodule_search_locations))).parent / src.path
    require(path.is_file(), f"{path} missing: reinstall {src.package}")
    return path


def clip(name: str, max_frames: int = 0) -> tuple[list[np.ndarray], float]:
    """A video source's frames (RGB) and its frame rate."""
    import cv2

    cap = cv2.VideoCapture(str(source_file(source(name))))
    fps = float(cap.get(cv2.CAP_PROP_FPS)) or 25.0
    frames = []
    while not max_frames or len(frames) < max_frames:
        ok, bgr = cap.read()
        if not ok:
            break
        frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    cap.release()
    require(frames, f"{name}: no frame could be read")
    return frames, fps


@cache
def source_images(name: str) -> tuple[tuple[str, np.ndarray], ...]:
    """(label, RGB image) of a source: the still, or each listed video frame."""
    import cv2

    src = source(name)
    if not src.frames:
        bgr = cv2.imread(str(source_file(src)), cv2.IMREAD_COLOR)
        require(bgr is not None, f"{source_file(src)} could not be decoded")
        return ((src.name, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)),)
    frames, _ = clip(name, max(src.frames) + 1)
    return tuple((f"{src.name}@{i}", frames[i]) for i in src.frames)


def face_hint(src: Source) -> tuple[float, float] | None:
    if not src.face:
        return None
    x, y = (float(v) for v in src.face.split(","))
    return x, y


@cache
def _truth(name: str) -> tuple[tuple[str, np.ndarray, np.ndarray], ...]:
    from testkit.referee import referee_points

    out = []
    for label, image in source_images(name):
        pts = referee_points(image, face_hint(source(name)))
        if pts is None:  # the manifest's fault, not the machine's: fix the frame list
            raise ValueError(f"the referee finds no face in {label}; change {MANIFEST}")
        out.append((label, image, pts))
    return tuple(out)


def make_variant(
    image: np.ndarray, points: np.ndarray, roll: float, height: float, light: str, style: str
) -> tuple[np.ndarray, np.ndarray]:
    """The image rolled by `roll` degrees about the face and scaled so the face is
    `height` px tall, on a canvas CONTEXT x that side; the points through the same map."""
    import cv2

    pts = np.asarray(points, np.float64)
    centre = (pts.min(0) + pts.max(0)) / 2
    scale = height / (pts[:, 1].max() - pts[:, 1].min())
    side = int(round(CONTEXT * height))
    m = cv2.getRotationMatrix2D((float(centre[0]), float(centre[1])), roll, scale)
    m[:, 2] += side / 2 - centre  # the face's centre to the canvas's
    out = cv2.warpAffine(
        image,
        m,
        (side, side),
        flags=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC,
        borderMode=cv2.BORDER_REPLICATE,
    )
    out = relight(out, light)
    if style == "stylized":
        out = cv2.cvtColor(
            cv2.stylization(cv2.cvtColor(out, cv2.COLOR_RGB2BGR), sigma_s=60, sigma_r=0.45),
            cv2.COLOR_BGR2RGB,
        )
    return out, pts @ m[:, :2].T + m[:, 2]


def relight(image: np.ndarray, light: str) -> np.ndarray:
    """dark: gamma 1.8 at 60 % (a dim room); warm: tungsten cast; "": unchanged."""
    if not light:
        return image
    x = image.astype(np.float32) / 255.0
    if light == "dark":
        x = 0.6 * x**1.8
    elif light == "warm":
        x = x * np.array([1.15, 0.95, 0.7], np.float32)
    else:
        raise ValueError(f"light={light!r} is not one of dark, warm")
    return (np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8)


def samples(names: tuple[str, ...] | None = None, variants: tuple[str, ...] | None = None):
    """Every sample of the named sources (all by default) in the named variants."""
    chosen = [s.name for s in sources()] if names is None else list(names)
    out: list[Sample] = []
    for name in chosen:
        for label, image, pts in _truth(name):
            for vname, roll, height, light, style in VARIANTS:
                if variants is not None and vname not in variants:
                    continue
                img, truth = make_variant(image, pts, roll, height, light, style)
                out.append(Sample(f"{label}/{vname}", source(name), vname, img, truth, height))
    return out


def face_box(sample: Sample, detector, proxy: int = 480) -> np.ndarray:
    """The face box the pipeline's tracker would give this sample: `detector` on the
    detection proxy (longer side `proxy` px), scaled back, the detection nearest the
    referee's face chosen (which face is judged, not where its points are)."""
    from pipeline.media import make_proxy

    small, scale = make_proxy(sample.image, proxy)
    dets = detector.detect([small])[0]
    if len(dets) == 0:
        raise ValueError(f"{detector.name} finds no face in {sample.name}")
    boxes = dets[:, :4] / scale
    centre = (sample.truth.min(0) + sample.truth.max(0)) / 2
    return boxes[np.argmin(np.linalg.norm((boxes[:, :2] + boxes[:, 2:]) / 2 - centre, axis=1))]
