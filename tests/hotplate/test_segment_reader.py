"""The server's reader of a growing fragmented MP4 (`stream_jobs.SegmentReader`), on the
bytes the real writer makes: it hands out one segment per read, however far the render
is ahead of a slow client, and nothing before a segment's last byte is in the file."""

import numpy as np
import pytest

from hotplate.serve.stream_jobs import SegmentReader
from pipeline.render.fmp4 import FragmentWriter

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def real_segments(frames: int = 60) -> list[bytes]:
    """A fragmented MP4 of noise (each fragment far from empty) as the writer's segments."""
    out: list[bytes] = []
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(16000 * frames // 25) * 0.1).astype(np.float32)
    with FragmentWriter(lambda kind, data: out.append(bytes(data)), 128, 128, 25, audio) as w:
        for _ in range(frames):
            w.write(rng.integers(0, 255, (128, 128, 3), dtype=np.uint8))
    return out


def test_one_read_holds_one_segment_however_far_the_render_is_ahead(tmp_path):
    segments = real_segments()
    assert len(segments) > 8 and segments[0][4:8] == b"ftyp"
    path = tmp_path / "job.mp4"
    path.write_bytes(b"".join(segments))  # the render is done: the client read nothing yet
    reader = SegmentReader(path)
    got = [reader.read() for _ in range(len(segments) + 1)]
    reader.close()
    assert got == [*segments, None]  # one whole segment per read, in order, then none


def test_a_segment_is_read_only_once_its_last_byte_is_written(tmp_path):
    segments = real_segments(30)
    path = tmp_path / "job.mp4"
    reader = SegmentReader(tmp_path / "job.mp4")
    assert reader.read() is None  # the worker has not created the file yet
    with open(path, "wb") as f:
        for segment in segments:
            for part in (segment[:4], segment[4:12], segment[12 : len(segment) - 1]):
                f.write(part)
                f.flush()
                assert reader.read() is None
            f.write(segment[-1:])
            f.flush()
            assert reader.read() == segment
    reader.close()
