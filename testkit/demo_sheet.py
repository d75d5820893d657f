"""2x mouth crops of a render: `python -m testkit.demo_sheet VIDEO OUT.png [FRAME ...]`.

`just demo`'s hot render (demo/out/pitch-hot.mp4) by default at eight frames spread over
it, speech and the silence before and after it; each crop is the mouth's box (the
referee's lips on the first frame, a mouth width around them) at twice its size, labelled
with its frame and the referee's lip gap there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def sheet(video: Path, out: Path, frames: list[int] | None = None) -> Path:
    import cv2

    from testkit.mouth_fixtures import lip_gap, video_frames
    from testkit.referee import referee_points

    got = video_frames(video)
    picks = frames or [int(i) for i in np.linspace(0, len(got) - 1, 8)]
    pts = referee_points(got[picks[0]])
    if pts is None:
        raise SystemExit(f"{video}: the referee finds no face in frame {picks[0]}")
    c, w = pts[48:68].mean(0), float(np.linalg.norm(pts[54] - pts[48]))
    x1, y1 = (c - [w, 0.7 * w]).astype(int)
    x2, y2 = (c + [w, 0.7 * w]).astype(int)
    tiles = []
    for i in picks:
        crop = cv2.resize(got[i][y1:y2, x1:x2], None, fx=2, fy=2, interpolation=cv2.INTER_CUBIC)
        p = referee_points(got[i])
        label = f"frame {i}: gap {lip_gap(p):.3f}" if p is not None else f"frame {i}: no face"
        cv2.putText(crop, label, (6, 22), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 0), 2)
        tiles.append(crop)
    rows = [np.concatenate(tiles[k : k + 4], 1) for k in range(0, len(tiles), 4)]
    if rows[-1].shape != rows[0].shape:
        pad = np.zeros_like(rows[0])
        pad[:, : rows[-1].shape[1]] = rows[-1]
        rows[-1] = pad
    cv2.imwrite(str(out), cv2.cvtColor(np.concatenate(rows, 0), cv2.COLOR_RGB2BGR))
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    sheet(Path(args[0]), Path(args[1]), [int(a) for a in args[2:]] or None)
