"""I420 frames (pipeline/yuv.py): a rectangle converted alone, a patch written back with
only the pixels it changed, at even and odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

from hotplate import demo_data
from pipeline.yuv import copy_frame, frame_from_rgb, paste_patch, planes, sparse_rgb, to_rgb

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def frame_of(w: int, h: int):
    rgb = demo_data.render_frame(demo_data.loop_params(1, (w, h))[0], (w, h))
    return frame_from_rgb(rgb)


def snapshot(frame) -> list[np.ndarray]:
    return [p.copy() for p in planes(frame)]


@pytest.mark.parametrize("size", [(360, 640), (361, 641)])
def test_a_rectangle_converts_as_the_whole_frame_does(size):
    frame = frame_of(*size)
    whole = to_rgb(frame)
    under, (x1, y1, x2, y2) = sparse_rgb(frame, (101, 203, 180, 300))
    assert x1 <= 101 and y1 <= 203 and x2 >= 180 and y2 >= 300 and x1 % 2 == y1 % 2 == 0
    np.testing.assert_array_equal(under[y1:y2, x1:x2], whole[y1:y2, x1:x2])


@pytest.mark.parametrize("size", [(360, 640), (361, 641)])
def test_a_patch_changes_only_its_changed_pixels(size):
    w, h = size
    stored = frame_of(w, h)
    box = (101, 203, 180, 300) if w % 2 == 0 else (w - 60, h - 45, w, h)  # odd: the edge
    under, _ = sparse_rgb(stored, box)
    x1, y1, x2, y2 = box
    before = snapshot(stored)

    unchanged = copy_frame(stored)
    paste_patch(unchanged, box, under[y1:y2, x1:x2].copy(), under)
    for got, want in zip(planes(unchanged), before, strict=True):
        np.testing.assert_array_equal(got, want)  # nothing drawn: bit for bit

    pixels = under[y1:y2, x1:x2].copy()
    pixels[10:13, 21:26] = (250, 20, 30)  # 3 x 5 px of red
    out = copy_frame(stored)
    paste_patch(out, box, pixels, under)
    y, u, v = planes(out)
    changed = np.argwhere(y != before[0])
    assert changed.size and changed[:, 0].min() >= y1 + 10 and changed[:, 0].max() < y1 + 13
    assert changed[:, 1].min() >= x1 + 21 and changed[:, 1].max() < x1 + 26
    for plane, old in ((u, before[1]), (v, before[2])):
        rows, cols = np.nonzero(plane != old)
        assert rows.size and (rows * 2 + 1).min() >= y1 + 10 and (rows * 2).max() < y1 + 13
        assert (cols * 2 + 1).min() >= x1 + 21 and (cols * 2).max() < x1 + 26
    red = to_rgb(out)[y1 + 10 : y1 + 13, x1 + 21 : x1 + 26].astype(int)
    assert np.abs(red - (250, 20, 30)).mean() < 40  # red, as I420 keeps it
    for got, want in zip(planes(stored), before, strict=True):
        np.testing.assert_array_equal(got, want)  # the shared stored frame is untouched
