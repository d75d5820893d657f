"""A sheet of 2x mouth crops of a render, for a person to look at (issue 62 item 5).

`python -m testkit.mouth_sheet VIDEO OUT.png [--cells 6] [--per-row 3]`: the render's
frames where the referee (dlib, testkit/referee.py) reads the mouth most open, in time
order, each cropped around the mouth (1.5 mouth widths across, one down) and scaled 2x
with cubic interpolation, the colours cut to 256 so the PNG stays small for docs/.
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np


def mouth_sheet(video: Path, out: Path, cells: int = 6, per_row: int = 3) -> list[int]:
    """Write the sheet of `video` to `out`; returns the frames shown."""
    import cv2
    from PIL import Image

    from testkit.mouth_fixtures import lip_gap, video_frames
    from testkit.referee import referee_points

    frames = video_frames(video)
    points = [referee_points(f) for f in frames]
    gaps = np.array([np.nan if p is None else lip_gap(p) for p in points])
    shown = sorted(int(t) for t in np.argsort(-np.nan_to_num(gaps, nan=-1.0))[:cells])

    def cell(t: int) -> np.ndarray:
        p = points[t]
        w = float(np.linalg.norm(p[54] - p[48]))
        cx, cy = p[48:68].mean(0)
        x1, y1 = int(cx - 0.75 * w), int(cy - 0.45 * w)
        crop = frames[t][max(y1, 0) : int(y1 + w), max(x1, 0) : int(x1 + 1.5 * w)]
        crop = cv2.resize(crop, (int(3 * w), int(2 * w)), interpolation=cv2.INTER_CUBIC)
        return crop

    tiles = [cell(t) for t in shown]
    h, w = tiles[0].shape[:2]
    tiles = [cv2.resize(c, (w, h)) for c in tiles]
    while len(tiles) % per_row:
        tiles.append(np.zeros_like(tiles[0]))
    rows = [np.concatenate(tiles[i : i + per_row], 1) for i in range(0, len(tiles), per_row)]
    sheet = Image.fromarray(np.concatenate(rows, 0))
    sheet.quantize(256, dither=Image.Dither.NONE).save(out, optimize=True)
    return shown


@click.command()
@click.argument("video", type=click.Path(exists=True, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--cells", default=6, show_default=True, help="Frames on the sheet.")
@click.option("--per-row", default=3, show_default=True, help="Frames per row.")
def main(video: Path, out: Path, cells: int, per_row: int) -> None:
    shown = mouth_sheet(video, out, cells, per_row)
    click.echo(f"{out}: frames {shown} of {video}, {out.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
