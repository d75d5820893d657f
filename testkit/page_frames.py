"""Every picture a page's <video id="player"> presents, read back into Python: the page
grabs each one (requestVideoFrameCallback) as its luma, BT.601 limited range as the
stored frames are compared, with when it arrived and when it is shown (the page's
performance clock); `drain` hands them to a MouthReader. For the Talk-mode browser test
and bench_webrtc's reading in chromium."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass

import numpy as np

GRAB = """
() => {
  const v = document.getElementById('player');
  const c = document.createElement('canvas');
  window.grabbed = [];
  const grab = (now, meta) => {
    if (v.videoWidth) {
      c.width = v.videoWidth; c.height = v.videoHeight;
      const g = c.getContext('2d', { willReadFrequently: true });
      g.drawImage(v, 0, 0);
      const d = g.getImageData(0, 0, c.width, c.height).data;
      const y = new Uint8Array(c.width * c.height);
      for (let i = 0, j = 0; j < y.length; i += 4, j++)
        y[j] = Math.round(16 + (65.481 * d[i] + 128.553 * d[i + 1] + 24.966 * d[i + 2]) / 255);
      let s = '';
      for (let at = 0; at < y.length; at += 8192) s += String.fromCharCode.apply(null, y.subarray(at, at + 8192));
      window.grabbed.push({ shown: meta.expectedDisplayTime || now, received: meta.receiveTime || null,
                            w: c.width, h: c.height, y: btoa(s) });
    }
    v.requestVideoFrameCallback(grab);
  };
  v.requestVideoFrameCallback(grab);
}
"""


@dataclass(frozen=True)
class Picture:
    shown: float  # s, the page's clock (see `monotonic_offset`)
    received: float | None  # s, when its last packet arrived (WebRTC only)
    index: int  # the stored loop frame it shows
    mouth: float  # the reader's score: the mean luma difference in the mouth's rectangle


def start(page) -> None:
    """Begin grabbing: call once the page is loaded."""
    page.evaluate(GRAB)


def drain(page, reader) -> list[Picture]:
    """Every picture grabbed since the last drain, read by `reader` (a MouthReader)."""
    out = []
    for g in page.evaluate("() => window.grabbed.splice(0)"):
        luma = np.frombuffer(base64.b64decode(g["y"]), np.uint8).reshape(g["h"], g["w"])
        got = g["received"] / 1000 if g["received"] else None
        out.append(Picture(g["shown"] / 1000, got, *reader.read(luma)))
    return out


def monotonic_offset(page) -> float:
    """What to add to the page's clock (s) to get Python's time.monotonic(), within half
    an evaluate's round trip."""
    before = time.monotonic()
    at = page.evaluate("performance.now()") / 1000
    return (before + time.monotonic()) / 2 - at
