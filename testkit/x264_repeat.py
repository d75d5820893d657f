"""Does x264 give the same bitstream for the same frames? Counts the distinct encodes of
the bank tests' talking clip (`mouth_fixtures.talking_clip`'s frames, before its
widening to whole 64s), padded by its edge to each size asked, with the heap dirtied
between encodes, as a process that ran other work first leaves it.

    python -m testkit.x264_repeat --sizes 660 672 704 --encodes 8

Prints one line per size: how many encodes came out as each bitstream
(docs/notebook/mouth.md, "The talking clip is the same clip every run")."""

from __future__ import annotations

import argparse
import hashlib
import io
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np


def clip_frames() -> np.ndarray:
    """(n, 660, 660, 3): grace_hopper speaking the bank tests' sentences, as the fixture
    renders them."""
    from testkit import faces
    from testkit.mouth_fixtures import SENTENCES, TALKING_RATE, espeak, talking_frames

    face = faces.samples(("grace_hopper",), ("upright",))[0].image
    wav = espeak(SENTENCES, Path(tempfile.mkdtemp()) / "speech.wav")
    return talking_frames(face, wav, TALKING_RATE)[0]


def encode(frames: np.ndarray, dirty: np.random.Generator) -> str:
    """The md5 of one encode, as `footage.write_clip` makes its video."""
    import av

    from testkit.footage import X264

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        video = out.add_stream("libx264", rate=Fraction(25), options=dict(X264))
        video.width, video.height, video.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for k, rgb in enumerate(frames):
            if k % 30 == 0:  # freed memory full of garbage, for the next allocations
                sizes = dirty.integers(1000, 2_000_000, 200)
                garbage = [bytearray(dirty.bytes(int(s))) for s in sizes]
                del garbage
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = k
            out.mux(video.encode(frame))
        out.mux(video.encode())
    return hashlib.md5(buf.getvalue()).hexdigest()[:8]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[660, 704], help="square sizes")
    ap.add_argument("--encodes", type=int, default=8, help="encodes per size")
    args = ap.parse_args()
    base, dirty = clip_frames(), np.random.default_rng(0)
    for size in args.sizes:
        if size < base.shape[1]:
            raise SystemExit(f"--sizes {size}: the clip is {base.shape[1]} square; pad, not crop")
        a = (size - base.shape[1]) // 2
        b = size - base.shape[1] - a
        frames = np.pad(base, ((0, 0), (a, b), (a, b), (0, 0)), "edge")
        seen: dict[str, int] = {}
        for _ in range(args.encodes):
            key = encode(frames, dirty)
            seen[key] = seen.get(key, 0) + 1
        print(
            f"{size}x{size}: {len(seen)} bitstream(s) in {args.encodes} encodes {seen}", flush=True
        )


if __name__ == "__main__":
    main()
