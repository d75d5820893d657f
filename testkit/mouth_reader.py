"""How open the mouth is in a decoded picture of a conversation session, read from the
pixels alone: the picture is matched to the stored loop frame it shows (nearest in luma,
the lower face left out of the match), and the mouth's rectangle of that frame is
compared with the stored one. An avatar at rest shows its stored frames (only the codec
differs); an open mouth differs there by far more. For the sessions' tests, the browser
test and bench_webrtc (mouth latency, read from what the receiver decoded)."""

from __future__ import annotations

import numpy as np

SCALE = 4  # the match runs on pictures this many times smaller
MARGIN = 4  # px around the lips' landmarks: the mouth's rectangle
AT_REST = 6.0  # mean luma difference in the mouth's rectangle: an idle picture's is ~3
OPEN = 12.0  # ... and a mouth opened by speech is 20 and more


class MouthReader:
    def __init__(self, assets) -> None:
        from pipeline.yuv import frame_from_rgb, planes

        self.lumas = [
            planes(frame_from_rgb(assets.load_frame(i)))[0].copy() for i in range(assets.n_frames)
        ]
        h, w = self.lumas[0].shape
        self.boxes = []
        keep = np.ones((h, w), bool)
        for i in range(assets.n_frames):
            lips = np.asarray(assets.landmarks[i][48:68], np.float32)
            x1, y1 = np.floor(lips.min(0)).astype(int) - MARGIN
            x2, y2 = np.ceil(lips.max(0)).astype(int) + MARGIN
            box = (max(x1, 0), max(y1, 0), min(x2, w), min(y2, h))
            self.boxes.append(box)
            # leave out of the match what a mouth moves: the lips and the jaw below them
            keep[max(y1 - 2 * MARGIN, 0) :, max(x1 - 4 * MARGIN, 0) : x2 + 4 * MARGIN] = False
        self.keep = keep[::SCALE, ::SCALE]
        self.small = np.stack(
            [lu[::SCALE, ::SCALE][self.keep].astype(np.float32) for lu in self.lumas]
        )

    def read(self, luma: np.ndarray) -> tuple[int, float]:
        """(the stored frame shown, the mean luma difference in its mouth rectangle)."""
        h, w = self.lumas[0].shape
        luma = luma[:h, :w]
        probe = luma[::SCALE, ::SCALE][self.keep].astype(np.float32)
        idx = int(np.argmin(np.mean(np.abs(self.small - probe), axis=1)))
        x1, y1, x2, y2 = self.boxes[idx]
        diff = np.abs(luma[y1:y2, x1:x2].astype(np.float32) - self.lumas[idx][y1:y2, x1:x2])
        return idx, float(diff.mean())
