"""Every picture a page's <video id="player"> presents, read back into Python: the page
grabs each one (requestVideoFrameCallback) as its luma, BT.601 limited range as the
stored frames are compared, with when it arrived and when it is shown (the page's
performance clock); `drain` hands them to a MouthReader. For the Talk-mode browser test
and bench_webrtc's reading in chromium."""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass

import numpy as np

from testkit.mouth_reader import SCALE

# Of each picture, only what a MouthReader reads: every `step`-th pixel of every
# `step`-th row (its match) and, whole, the box around every frame's mouth. Reading the
# whole luma in script held a 540x960 page to 15 pictures a second, the session starved.
GRAB = """
({ step, box }) => {
  const v = document.getElementById('player');
  const c = document.createElement('canvas');
  const g = c.getContext('2d', { willReadFrequently: true });
  const luma = (d, i) => Math.round(16 + (65.481 * d[i] + 128.553 * d[i + 1] + 24.966 * d[i + 2]) / 255);
  window.grabbed = [];
  const grab = (now, meta) => {
    const w = v.videoWidth, h = v.videoHeight;
    if (w) {
      if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
      g.drawImage(v, 0, 0);
      const d = g.getImageData(0, 0, w, h).data;
      const [x1, y1, x2, y2] = [Math.min(box[0], w), Math.min(box[1], h), Math.min(box[2], w), Math.min(box[3], h)];
      const y = new Uint8Array(Math.ceil(w / step) * Math.ceil(h / step) + (x2 - x1) * (y2 - y1));
      let j = 0;
      for (let r = 0; r < h; r += step) for (let q = 0; q < w; q += step) y[j++] = luma(d, 4 * (r * w + q));
      for (let r = y1; r < y2; r++) for (let q = x1; q < x2; q++) y[j++] = luma(d, 4 * (r * w + q));
      let s = '';
      for (let at = 0; at < y.length; at += 8192) s += String.fromCharCode.apply(null, y.subarray(at, at + 8192));
      window.grabbed.push({ shown: meta.expectedDisplayTime || now, received: meta.receiveTime || null,
                            w, h, box: [x1, y1, x2, y2], y: btoa(s) });
    }
    v.requestVideoFrameCallback(grab);
  };
  v.requestVideoFrameCallback(grab);
}
"""


def talk_args(microphone) -> list[str]:
    """Chromium's flags for the page's Talk mode on loopback: a fake microphone playing
    the WAV `microphone`, media allowed without a click."""
    return [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone}",
        "--autoplay-policy=no-user-gesture-required",
        "--allow-loopback-in-peer-connection",  # candidates on 127.0.0.1, as the server's
        "--disable-features=WebRtcHideLocalIpsWithMdns",  # no mDNS names to resolve
        *(["--no-sandbox"] if os.geteuid() == 0 else []),
    ]


@dataclass(frozen=True)
class Picture:
    shown: float  # s, the page's clock (see `monotonic_offset`)
    received: float | None  # s, when its last packet arrived (WebRTC only)
    index: int  # the stored loop frame it shows
    mouth: float  # the reader's score: the mean luma difference in the mouth's rectangle


def start(page, reader) -> None:
    """Begin grabbing what `reader` (a MouthReader) reads: call once the page is loaded."""
    boxes = np.array(reader.boxes)
    box = [int(boxes[:, 0].min()), int(boxes[:, 1].min())]
    box += [int(boxes[:, 2].max()), int(boxes[:, 3].max())]
    page.evaluate(GRAB, {"step": SCALE, "box": box})


def drain(page, reader) -> list[Picture]:
    """Every picture grabbed since the last drain, read by `reader` (a MouthReader)."""
    out = []
    for g in page.evaluate("() => window.grabbed.splice(0)"):
        got = np.frombuffer(base64.b64decode(g["y"]), np.uint8)
        w, h, (x1, y1, x2, y2) = g["w"], g["h"], g["box"]
        luma = np.zeros((h, w), np.uint8)  # what the reader does not read stays 0
        grid = luma[::SCALE, ::SCALE]
        grid[:] = got[: grid.size].reshape(grid.shape)
        luma[y1:y2, x1:x2] = got[grid.size :].reshape(y2 - y1, x2 - x1)
        arrived = g["received"] / 1000 if g["received"] else None
        out.append(Picture(g["shown"] / 1000, arrived, *reader.read(luma)))
    return out


def monotonic_offset(page) -> float:
    """What to add to the page's clock (s) to get Python's time.monotonic(), within half
    an evaluate's round trip."""
    before = time.monotonic()
    at = page.evaluate("performance.now()") / 1000
    return (before + time.monotonic()) / 2 - at
