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

import functools
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.nets.backends import weight_names
from pipeline.nets.models import file_identity, find_weights

EXPAND = 1.5  # blend square side / longer side of the crop box (MuseTalk's expand)

# iBUG-300W jaw (0-16), brows (17-26) and nose (27-35): their hull is the face oval;
# the outer lip contour (48-59) is added so a mouth placed low stays inside, and the
# lower jaw (4-12) once more, lowered by the most the warp renderer drops it
# (JAW_ROOM x the nose-to-chin height along the face's down axis), so an opened chin
# is not cut off by the mask.
FACE_HULL = np.arange(0, 36)
LIPS = np.arange(48, 60)
LOWER_JAW = np.arange(4, 13)
JAW_ROOM = 0.16

# CelebAMask-HQ labels of face-parsing.PyTorch: 1 skin, 10 nose, 11 mouth, 12/13 lips,
# 14 neck. Upstream MuseTalk's modes (musetalk/utils/face_parsing/__init__.py): "raw" is
# skin, mouth and lips; "neck" adds the neck; "jaw" (v1.5's default) grows the skin
# downwards with a cone kernel, erodes it at the cheeks and never takes the nose.
# Hair (17), cloth (16), hat (18) and background (0) are always left out.
SKIN, NOSE_LABEL = 1, 10
MOUTH_LIPS = (11, 12, 13)
RAW_CLASSES = (SKIN, *MOUTH_LIPS)
NECK_CLASSES = (*RAW_CLASSES, 14)
CHEEK_WIDTH = 90  # px of the 512 parse kept un-eroded each side of the centre (v1.5's 90)
UPPER_BOUNDARY = 0.5  # upstream's upper_boundary_ratio: the square's upper half is cleared
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
    """(size, size) uint8 mask over `square` from the convex hull of the face oval
    (jaw, brows, nose), the lips and the room an opened jaw needs (see FACE_HULL);
    see the module docstring for what the values mean."""
    import cv2

    pts = np.asarray(landmarks, np.float64)
    if pts.shape != (68, 2) or not np.isfinite(pts).all():
        raise ValueError(f"landmarks must be (68, 2) finite floats, got shape {pts.shape}")
    mask = np.zeros((size, size), np.uint8)
    # Pixel centres sit at i + 0.5 in mask coordinates; cv2 puts them at i. Drawing
    # with 4 fractional bits keeps the polygon sub-pixel exact.
    across = pts[42:48].mean(0) - pts[36:42].mean(0)
    down = np.array([-across[1], across[0]]) / max(float(np.linalg.norm(across)), 1e-6)
    lowered = pts[LOWER_JAW] + JAW_ROOM * float((pts[8] - pts[33]) @ down) * down
    outline = np.concatenate([pts[FACE_HULL], pts[LIPS], lowered])
    hull = cv2.convexHull(((_to_mask(outline, square, size) - 0.5) * 16).round().astype(np.int32))
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
        """(512, 512) uint8 labels of an RGB uint8 image, resized to 512 as upstream
        (PIL bilinear, then ToTensor and ImageNet normalisation in float32)."""
        import torch
        from PIL import Image

        img = Image.fromarray(np.ascontiguousarray(image_rgb)).resize(
            (BISENET_INPUT, BISENET_INPUT), Image.BILINEAR
        )
        t = torch.from_numpy(np.asarray(img, np.uint8).copy()).permute(2, 0, 1).float() / 255
        t = (t - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[
            :, None, None
        ]
        from pipeline.nets.bisenet import run_bisenet

        with torch.inference_mode():
            logits = run_bisenet(self._net, t[None].to(self.device))[0]
        return logits.argmax(0).to(torch.uint8).cpu().numpy()


@functools.cache
def _jaw_kernels(cheek_width: int = CHEEK_WIDTH) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cone, cheek, cheek_mask) of upstream's jaw mode: a 33x33 kernel, a cone widening
    downwards from the centre row (rows 10-20) over a 21 px wide stem (rows 21-32), so a
    dilation grows the skin down over the jaw line; a flat 35x3 ellipse that erodes the
    cheeks; and the 512x512 mask of the columns more than `cheek_width` from the centre."""
    import cv2

    cone_h, tail_h = 21, 12
    size = cone_h + tail_h
    cone = np.zeros((size, size), np.uint8)
    c = size // 2
    for row in range(cone_h // 2, cone_h):
        half = row - cone_h // 2  # width 2 * half + 1
        cone[row, c - half : c + half + 1] = 1
    stem = int(cone[cone_h - 1].sum()) // 2
    cone[cone_h:, max(0, c - stem) : min(size, c + stem + 1)] = 1
    cheek = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (35, 3))
    sides = np.zeros((BISENET_INPUT, BISENET_INPUT), np.uint8)
    centre = BISENET_INPUT // 2
    sides[:, : centre - cheek_width + 1] = 255  # cv2.rectangle's right edge is inclusive
    sides[:, centre + cheek_width :] = 255
    return cone, cheek, sides


def parsing_mask(
    labels: np.ndarray, mode: str = "jaw", cheek_width: int = CHEEK_WIDTH
) -> np.ndarray:
    """(512, 512) uint8 0/255 blend region of a label map in upstream's `mode`."""
    import cv2

    if mode == "raw":
        return np.where(np.isin(labels, RAW_CLASSES), 255, 0).astype(np.uint8)
    if mode == "neck":
        return np.where(np.isin(labels, NECK_CLASSES), 255, 0).astype(np.uint8)
    if mode != "jaw":
        raise ValueError(f"parsing_mode={mode!r} is not one of jaw, raw, neck")
    cone, cheek, sides = _jaw_kernels(cheek_width)
    skin = np.where(labels == SKIN, 255, 0).astype(np.uint8)
    grown = cv2.dilate(skin, cone, iterations=1)
    eroded = cv2.erode(grown, cheek, iterations=2)
    # eroded at the sides, grown in the middle
    region = cv2.bitwise_or(cv2.bitwise_and(eroded, sides), cv2.bitwise_and(grown, ~sides))
    keep = ((region == 255) & (labels != NOSE_LABEL)) | np.isin(labels, MOUTH_LIPS)
    return np.where(keep, 255, 0).astype(np.uint8)


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
    mode: str = "jaw",
) -> np.ndarray:
    """(size, size) uint8 mask over `square` from face parsing, made as upstream's
    `get_image_prepare_material` makes it, at the square's full resolution: parse the
    square (resized to 512), the region of `mode`, back to the square's size (PIL bicubic),
    kept inside the crop box, the upper half cleared, then blurred (kernel `feather` x
    side); only then resized to `size` for the store."""
    import cv2
    from PIL import Image

    region = square_region(frame, square)
    side_h, side_w = region.shape[:2]
    parsed = parsing_mask(parser.parse(region), mode)
    full = np.asarray(Image.fromarray(parsed).resize((side_w, side_h)), np.uint8)
    x1, y1, x2, y2 = (int(v) for v in np.asarray(crop_box).reshape(-1))
    sx, sy = int(square[0]), int(square[1])
    limited = np.zeros_like(full)
    bx1, by1 = max(0, x1 - sx), max(0, y1 - sy)
    bx2, by2 = min(side_w, x2 - sx), min(side_h, y2 - sy)
    limited[by1:by2, bx1:bx2] = full[by1:by2, bx1:bx2]
    limited[: int(side_h * UPPER_BOUNDARY)] = 0
    k = int(feather * side_w // 2 * 2) + 1  # upstream's formula, on the full-size square
    if k >= 3:
        limited = cv2.GaussianBlur(limited, (k, k), 0)
    return store_size(limited, size)


def store_size(mask: np.ndarray, size: int) -> np.ndarray:
    """A full-resolution mask resized to the stored (size, size): area averaging down,
    bicubic up (the renderer's bilinear fit back then stays within 2/255 of the original)."""
    import cv2

    if mask.shape == (size, size):
        return mask
    interp = cv2.INTER_AREA if mask.shape[0] > size else cv2.INTER_CUBIC
    return cv2.resize(mask, (size, size), interpolation=interp)
