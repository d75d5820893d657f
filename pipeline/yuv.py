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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import av


@dataclass(frozen=True)
class Mouth:
    """What a renderer redrew in one frame: `rgb` over `box` (frame pixels, x2/y2
    exclusive), blended in through `alpha` (uint8 0..255, same size: 0 keeps the stored
    pixel bit for bit, 255 takes the mouth's)."""

    box: tuple[int, int, int, int]
    rgb: np.ndarray
    alpha: np.ndarray


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


def _mix(dst: np.ndarray, src: np.ndarray, a: np.ndarray) -> None:
    """dst = dst + a (src - dst), a in 0..255, rounded as the RGB blend rounds it: a = 0
    leaves dst exactly as it was."""
    a = a.astype(np.uint16)
    dst[...] = (
        (dst.astype(np.uint16) * (255 - a) + src.astype(np.uint16) * a + 127) // 255
    ).astype(np.uint8)


def blend_mouth(frame: av.VideoFrame, mouth: Mouth) -> None:
    """Blend `mouth` into `frame` (written in place) in I420: luma through its alpha,
    chroma through the alpha averaged over each 2x2 block. Outside the alpha the planes
    keep their bytes."""
    import cv2

    y, u, v = planes(frame)
    h, w = y.shape
    bx1, by1, bx2, by2 = (int(c) for c in mouth.box)
    x1, y1, x2, y2 = max(bx1, 0), max(by1, 0), min(bx2, w), min(by2, h)
    if x2 <= x1 or y2 <= y1:
        return
    # the even-aligned rectangle around the mouth; its padding has alpha 0
    ex1, ey1 = x1 & ~1, y1 & ~1
    ex2, ey2 = x2 + (x2 - ex1) % 2, y2 + (y2 - ey1) % 2
    rgb = np.zeros((ey2 - ey1, ex2 - ex1, 3), np.uint8)
    alpha = np.zeros((ey2 - ey1, ex2 - ex1), np.uint8)
    rgb[y1 - ey1 : y2 - ey1, x1 - ex1 : x2 - ex1] = mouth.rgb[
        y1 - by1 : y2 - by1, x1 - bx1 : x2 - bx1
    ]
    alpha[y1 - ey1 : y2 - ey1, x1 - ex1 : x2 - ex1] = mouth.alpha[
        y1 - by1 : y2 - by1, x1 - bx1 : x2 - bx1
    ]
    my, mu, mv = _split_i420(cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420), ey2 - ey1, ex2 - ex1)
    ry2, rx2 = min(ey2, h), min(ex2, w)  # an odd frame's last row/column has no partner
    _mix(y[ey1:ry2, ex1:rx2], my[: ry2 - ey1, : rx2 - ex1], alpha[: ry2 - ey1, : rx2 - ex1])
    a = alpha.astype(np.uint16)
    ca = ((a[0::2, 0::2] + a[1::2, 0::2] + a[0::2, 1::2] + a[1::2, 1::2] + 2) // 4).astype(np.uint8)
    cy1, cx1 = ey1 // 2, ex1 // 2
    cy2, cx2 = min(cy1 + ca.shape[0], u.shape[0]), min(cx1 + ca.shape[1], u.shape[1])
    for plane, m in ((u, mu), (v, mv)):
        _mix(plane[cy1:cy2, cx1:cx2], m[: cy2 - cy1, : cx2 - cx1], ca[: cy2 - cy1, : cx2 - cx1])
