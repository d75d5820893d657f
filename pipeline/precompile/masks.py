"""Blend masks (precompile stage 5).

A mask is (size, size) uint8 and covers the *blend square* of its frame (see
`blend_square`), resampled to size x size: 255 = use the rendered pixel, 0 = keep
the stored frame, values between blend linearly. Inside the square the mask is the
face region (from the landmarks, or from BiSeNet face parsing) limited to the crop
box, exactly 0 above the crop box's vertical middle (the eyes and everything above
are never redrawn), with edges feathered by a Gaussian blur about `feather` x the
square's width. The square may extend past the frame; the renderer clips it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.nets.backends import weight_names
from pipeline.nets.models import file_identity, find_weights

EXPAND = 1.5  # blend square side / longer side of the crop box (MuseTalk's expand)

# iBUG-300W jaw (0-16), brows (17-26) and nose (27-35): their hull is the face.
FACE_HULL = np.arange(0, 36)

# CelebAMask-HQ labels of face-parsing.PyTorch: 1 skin, 10 nose, 11 mouth, 12/13 lips.
# Hair (17), neck (14, 15), cloth (16), hat (18) and background (0) are left out.
FACE_CLASSES = (1, 10, 11, 12, 13)
BISENET_WEIGHTS = weight_names("mask", "bisenet")
BISENET_INPUT = 512  # the resolution the parser was trained at
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def blend_square(crop_box: np.ndarray, frame_shape: tuple[int, ...] | None = None) -> np.ndarray:
    """int32 [x1, y1, x2, y2] of the square around the crop box centre with
    half-side int(max(w, h) // 2 * 1.5) (MuseTalk's `get_crop_box`). It is not
    clipped to the frame (`frame_shape` is accepted for symmetry and ignored)."""
    x1, y1, x2, y2 = (int(v) for v in np.asarray(crop_box).reshape(-1))
    cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
    s = max(1, int(max(x2 - x1, y2 - y1) // 2 * EXPAND))
    return np.array([cx - s, cy - s, cx + s, cy + s], dtype=np.int32)


def _to_mask(points: np.ndarray, square: np.ndarray, size: int) -> np.ndarray:
    """Frame coordinates -> mask coordinates (continuous, pixel i spans [i, i+1))."""
    side = float(square[2] - square[0])
    return (np.asarray(points, np.float64) - square[:2]) * (size / side)


def landmark_mask(
    landmarks: np.ndarray,
    crop_box: np.ndarray,
    square: np.ndarray,
    size: int = 256,
    feather: float = 0.1,
) -> np.ndarray:
    """(size, size) uint8 mask over `square` from the convex hull of the jaw, brows
    and nose; see the module docstring for what the values mean."""
    import cv2

    pts = np.asarray(landmarks, np.float64)
    if pts.shape != (68, 2) or not np.isfinite(pts).all():
        raise ValueError(f"landmarks must be (68, 2) finite floats, got shape {pts.shape}")
    mask = np.zeros((size, size), np.uint8)
    # Pixel centres sit at i + 0.5 in mask coordinates; cv2 puts them at i. Drawing
    # with 4 fractional bits keeps the polygon sub-pixel exact.
    hull = cv2.convexHull(
        ((_to_mask(pts[FACE_HULL], square, size) - 0.5) * 16).round().astype(np.int32)
    )
    cv2.fillConvexPoly(mask, hull, 255, lineType=cv2.LINE_8, shift=4)
    return finish_mask(mask, crop_box, square, feather)


def finish_mask(
    mask: np.ndarray, crop_box: np.ndarray, square: np.ndarray, feather: float
) -> np.ndarray:
    """Limit a face mask over `square` to the crop box, clear the upper half, feather."""
    import cv2

    size = mask.shape[0]
    box = _to_mask(np.asarray(crop_box, np.float64).reshape(2, 2), square, size)
    (bx1, by1), (bx2, by2) = np.clip(np.round(box), 0, size).astype(int)
    middle = int(np.clip(np.round((box[0, 1] + box[1, 1]) / 2), 0, size))
    limited = np.zeros_like(mask)
    top = max(by1, middle)
    limited[top:by2, bx1:bx2] = mask[top:by2, bx1:bx2]
    k = int(feather * size // 2 * 2) + 1  # odd kernel, MuseTalk's formula
    if k >= 3:
        limited = cv2.GaussianBlur(limited, (k, k), 0)
        limited[:middle] = 0  # the blur leaks upwards; the upper half must stay exactly 0
    return limited


class FaceParser:
    """BiSeNet face parsing; `parse` gives CelebAMask-HQ labels 0..18."""

    name = "bisenet"

    def __init__(self, path: Path) -> None:
        import torch

        from pipeline.nets.bisenet import build_bisenet

        self.path = path
        self.identity = file_identity(path)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        net = build_bisenet()
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
                state = state["state_dict"]
            net.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(
                f"{path} is not a BiSeNet face-parsing checkpoint ({first}); replace it"
            ) from e
        self._net: Any = net.to(self.device).eval()

    def parse(self, image_rgb: np.ndarray) -> np.ndarray:
        """(H, W) uint8 labels of an RGB uint8 image (resized to 512 for the network)."""
        import cv2
        import torch

        from pipeline.nets.bisenet import run_bisenet

        h, w = image_rgb.shape[:2]
        x = cv2.resize(
            np.ascontiguousarray(image_rgb),
            (BISENET_INPUT, BISENET_INPUT),
            interpolation=cv2.INTER_LINEAR,
        )
        x = (x.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
        t = torch.from_numpy(x.astype(np.float32)).permute(2, 0, 1)[None].to(self.device)
        labels = run_bisenet(self._net, t)[0].argmax(0).to(torch.uint8).cpu().numpy()
        return cv2.resize(labels, (w, h), interpolation=cv2.INTER_NEAREST)


def load_face_parser(name: str, models_dir: Path | str | None) -> FaceParser:
    """Load the face parser `name` (only "bisenet"); never downloads.

    Raises ModelMissingError when `79999_iter.pth` is not in the models dir,
    ValueError for an unknown name or a file that is not BiSeNet weights.
    """
    if name != "bisenet":
        raise ValueError(f"face parser {name!r} is not one of bisenet")
    return FaceParser(find_weights(models_dir, BISENET_WEIGHTS, "BiSeNet face-parsing"))


def square_region(frame: np.ndarray, square: np.ndarray) -> np.ndarray:
    """The frame pixels inside `square`, black where the square leaves the frame."""
    x1, y1, x2, y2 = (int(v) for v in np.asarray(square).reshape(-1))
    out = np.zeros((y2 - y1, x2 - x1, 3), np.uint8)
    h, w = frame.shape[:2]
    sx1, sy1, sx2, sy2 = max(0, x1), max(0, y1), min(w, x2), min(h, y2)
    if sx2 > sx1 and sy2 > sy1:
        out[sy1 - y1 : sy2 - y1, sx1 - x1 : sx2 - x1] = frame[sy1:sy2, sx1:sx2]
    return out


def bisenet_mask(
    parser: FaceParser,
    frame: np.ndarray,
    crop_box: np.ndarray,
    square: np.ndarray,
    size: int = 256,
    feather: float = 0.1,
) -> np.ndarray:
    """(size, size) uint8 mask over `square` from face parsing (skin, nose, mouth,
    lips); limited, cleared and feathered as `landmark_mask`."""
    import cv2

    region = cv2.resize(square_region(frame, square), (size, size), interpolation=cv2.INTER_AREA)
    labels = parser.parse(region)
    mask = np.where(np.isin(labels, FACE_CLASSES), 255, 0).astype(np.uint8)
    return finish_mask(mask, crop_box, square, feather)
