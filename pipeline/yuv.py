"""I420 frames: what the stored frames decode to and what x264 takes.

A frame here is a PyAV `VideoFrame` in yuv420p, BT.601 limited range, the planes
`cv2.COLOR_RGB2YUV_I420` makes from RGB. A hot render hands these from the store's
decoder to the encoder and converts only the mouth's rectangle to RGB and back
(`rgb_rect`, `blend_mouth`): no whole frame goes through RGB. Frames may have odd
sizes (chroma planes are then rounded up, as JPEG and FFmpeg do); the encoder crops
to even when it copies (`copy_frame`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import av


def planes(frame: av.VideoFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Writable (h, w) views of the Y, U and V planes (rows may be padded in memory)."""
    out = []
    for p in frame.planes:
        flat = np.frombuffer(p, np.uint8)
        if flat.size >= p.line_size * p.height:
            out.append(flat.reshape(-1, p.line_size)[: p.height, : p.width])
        else:  # a tiny plane whose last row is not padded
            view = np.lib.stride_tricks.as_strided(flat, (p.height, p.width), (p.line_size, 1))
            out.append(view)
    return out[0], out[1], out[2]


def nbytes(frame: av.VideoFrame) -> int:
    return sum(p.buffer_size for p in frame.planes)


def frame_from_planes(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> av.VideoFrame:
    """A new I420 frame of y's size; u and v are cropped to its chroma size (so larger
    chroma planes, as FFmpeg gives a JPEG one pixel wide, are taken from their corner)."""
    import av

    h, w = y.shape
    frame = av.VideoFrame(w, h, "yuv420p")
    frame.color_range = 1  # MPEG (limited), as the planes are
    for dst, src in zip(planes(frame), (y, u, v), strict=True):
        dst[...] = src[: dst.shape[0], : dst.shape[1]]
    return frame


def _split_i420(yuv: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cv2's packed I420 array ((h * 3 / 2, w), even h and w) -> its three planes."""
    q = (h // 2) * (w // 2)
    flat = yuv.reshape(-1)
    return (
        yuv[:h],
        flat[h * w : h * w + q].reshape(h // 2, w // 2),
        flat[h * w + q :].reshape(h // 2, w // 2),
    )


def i420_of_rgb(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y (h, w) and U, V (ceil(h/2), ceil(w/2)) of an RGB uint8 image of any size: an odd
    edge is repeated for the chroma of the last row or column."""
    import cv2

    h, w = rgb.shape[:2]
    if h % 2 or w % 2:
        rgb = cv2.copyMakeBorder(rgb, 0, h % 2, 0, w % 2, cv2.BORDER_REPLICATE)
    ph, pw = rgb.shape[:2]
    y, u, v = _split_i420(cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2YUV_I420), ph, pw)
    return y[:h, :w], u, v


def frame_from_rgb(rgb: np.ndarray) -> av.VideoFrame:
    """An RGB uint8 (h, w, 3) image as an I420 frame of the same size."""
    return frame_from_planes(*i420_of_rgb(rgb))


def copy_frame(frame: av.VideoFrame, width: int | None = None, height: int | None = None):
    """A new frame holding `frame`'s pixels (cropped to width x height), for the caller
    to write into: stored frames are shared (a cache may show them again)."""
    y, u, v = planes(frame)
    h, w = height or y.shape[0], width or y.shape[1]
    return frame_from_planes(y[:h, :w], u[: (h + 1) // 2, : (w + 1) // 2], v)


def _i420_rect(frame: av.VideoFrame, box: Sequence[int]) -> tuple[np.ndarray, tuple[int, ...]]:
    """cv2's packed I420 of the even-aligned rectangle around `box` (clipped to the
    frame; an odd frame's last row or column is repeated to fill it), and that rectangle."""
    y, u, v = planes(frame)
    h, w = y.shape
    x1, y1 = max(int(box[0]), 0) & ~1, max(int(box[1]), 0) & ~1
    x2, y2 = min(int(box[2]) + 1, w + w % 2) & ~1, min(int(box[3]) + 1, h + h % 2) & ~1
    luma = y[y1:y2, x1:x2]
    if luma.shape != (y2 - y1, x2 - x1):
        luma = np.pad(luma, ((0, y2 - y1 - luma.shape[0]), (0, x2 - x1 - luma.shape[1])), "edge")
    ch, cw = (y2 - y1) // 2, (x2 - x1) // 2
    cu = u[y1 // 2 : y1 // 2 + ch, x1 // 2 : x1 // 2 + cw]
    cv = v[y1 // 2 : y1 // 2 + ch, x1 // 2 : x1 // 2 + cw]
    packed = np.concatenate([luma.reshape(-1), cu.reshape(-1), cv.reshape(-1)])
    return packed.reshape(-1, x2 - x1), (x1, y1, x2, y2)


def to_rgb(frame: av.VideoFrame) -> np.ndarray:
    """The whole frame as RGB uint8 (h, w, 3): for renderers that draw on full frames."""
    return rgb_rect(frame, (0, 0, frame.width, frame.height))


def rgb_rect(frame: av.VideoFrame, box: Sequence[int]) -> np.ndarray:
    """RGB uint8 of `box` [x1, y1, x2, y2] (inside the frame), converted alone."""
    import cv2

    x1, y1, x2, y2 = (int(v) for v in box)
    packed, (ax1, ay1, _, _) = _i420_rect(frame, box)
    rgb = cv2.cvtColor(packed, cv2.COLOR_YUV2RGB_I420)
    return np.ascontiguousarray(rgb[y1 - ay1 : y2 - ay1, x1 - ax1 : x2 - ax1])


def sparse_rgb(
    frame: av.VideoFrame, box: Sequence[int], out: np.ndarray | None = None
) -> tuple[np.ndarray, tuple[int, ...]]:
    """A whole-frame RGB array whose pixels are valid only inside the even-aligned
    rectangle around `box` (which is returned): what a renderer that reads only `box` is
    given, at the price of that rectangle's conversion. `out`: an (h, w, 3) uint8 array
    to write into, reused from frame to frame (a new one, np.empty, costs the page
    faults of every row the rectangle touches: ~2 ms a frame at 1080x1920)."""
    import cv2

    packed, (x1, y1, x2, y2) = _i420_rect(frame, box)
    shape = (frame.height, frame.width, 3)
    rgb = out if out is not None and out.shape == shape else np.empty(shape, np.uint8)
    rect = cv2.cvtColor(packed, cv2.COLOR_YUV2RGB_I420)
    h, w = min(y2, frame.height) - y1, min(x2, frame.width) - x1
    rgb[y1 : y1 + h, x1 : x1 + w] = rect[:h, :w]
    return rgb, (x1, y1, x2, y2)


def paste_patch(
    frame: av.VideoFrame, box: Sequence[int], pixels: np.ndarray, under: np.ndarray
) -> None:
    """Write RGB `pixels` (over `box`) into `frame`'s planes, in place. `under` is the
    whole-frame RGB the pixels were drawn over (valid around `box`, as `sparse_rgb` makes
    it): luma changes only where a pixel differs from it, chroma only in the 2x2 blocks
    that hold one, so the rest of the planes keep their bytes."""
    import cv2

    y, u, v = planes(frame)
    h, w = y.shape
    bx1, by1, bx2, by2 = (int(c) for c in box)
    ex1, ey1 = bx1 & ~1, by1 & ~1
    ex2, ey2 = min(bx2 + (bx2 - ex1) % 2, w + w % 2), min(by2 + (by2 - ey1) % 2, h + h % 2)
    # the even-aligned rectangle: the patch over what it was drawn on (edge-padded at an
    # odd frame's last row or column)
    rect = under[ey1:ey2, ex1:ex2]
    if rect.shape[:2] != (ey2 - ey1, ex2 - ex1):
        pad = ((0, ey2 - ey1 - rect.shape[0]), (0, ex2 - ex1 - rect.shape[1]), (0, 0))
        rect = np.pad(rect, pad, "edge")
    rect = rect.copy()
    inner = rect[by1 - ey1 : by2 - ey1, bx1 - ex1 : bx2 - ex1]
    changed = np.zeros(rect.shape[:2], bool)
    # (per channel, or'd: np.any over the last axis took 1.4 ms of a 2.5 ms paste at
    # 1080x1920, the or's 0.1)
    ne = inner != pixels
    changed[by1 - ey1 : by2 - ey1, bx1 - ex1 : bx2 - ex1] = ne[..., 0] | ne[..., 1] | ne[..., 2]
    if not changed.any():
        return
    inner[...] = pixels
    my, mu, mv = _split_i420(cv2.cvtColor(rect, cv2.COLOR_RGB2YUV_I420), ey2 - ey1, ex2 - ex1)
    ry2, rx2 = min(ey2, h), min(ex2, w)  # an odd frame's padding is not written back
    luma = changed[: ry2 - ey1, : rx2 - ex1]
    y[ey1:ry2, ex1:rx2][luma] = my[: ry2 - ey1, : rx2 - ex1][luma]
    rows = changed[0::2] | changed[1::2]  # the 2x2 blocks holding a change
    blocks = rows[:, 0::2] | rows[:, 1::2]
    cy1, cx1 = ey1 // 2, ex1 // 2
    for plane, m in ((u, mu), (v, mv)):
        plane[cy1 : cy1 + blocks.shape[0], cx1 : cx1 + blocks.shape[1]][blocks] = m[blocks]
