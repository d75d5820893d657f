import os
from fractions import Fraction

import av
import numpy as np
import pytest

from pipeline.render.encode import Mp4Writer, aac_rate, fps_fraction
from testkit.render_fixtures import speech, threads_down_to

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def gradient(t, w, h):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack(
        [(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), np.full_like(x, (t * 9) % 256)], -1
    )
    return img.astype(np.uint8)


def write(path, n, w=64, h=48, fps=25, audio=None, sr=16000):
    with Mp4Writer(path, w, h, fps, audio=audio, sample_rate=sr) as wr:
        for t in range(n):
            wr.write(gradient(t, w, h))
    return path


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("end", ["close", "abort"])
def test_a_closed_writer_holds_no_encoder_thread(tmp_path, end):
    """close() and abort() free the encoders there and then, while the writer is still
    referenced: a caller that keeps it (or a cycle that holds it until the collector
    runs) keeps no thread of a finished video."""
    audio = speech(1.0, 16000)
    write(tmp_path / "warm.mp4", 10, 320, 240, audio=audio)  # process-wide pools (OpenCV's)
    before = threads()
    w = Mp4Writer(tmp_path / "o.mp4", 320, 240, 25, audio=audio, sample_rate=16000)
    w.open()
    for t in range(10):
        w.write(gradient(t, 320, 240))
    assert threads() > before  # x264's own, at 320x240: what a kept encoder would keep
    getattr(w, end)()
    assert threads_down_to(before) <= before, (before, threads())


def test_h264_aac_roundtrip(tmp_path):
    sr, seconds, fps = 16000, 2.0, 25
    audio = speech(seconds, sr)
    path = write(tmp_path / "out.mp4", 50, 64, 48, fps, audio, sr)
    with av.open(str(path)) as c:
        v, a = c.streams.video[0], c.streams.audio[0]
        assert v.codec_context.name == "h264" and a.codec_context.name == "aac"
        assert (v.codec_context.width, v.codec_context.height) == (64, 48)
        assert v.codec_context.pix_fmt == "yuv420p"
        assert v.average_rate == 25 and a.rate == 48000
        assert abs(float(a.duration * a.time_base) - seconds) < 1 / fps
        assert abs(float(v.duration * v.time_base) - seconds) < 1 / fps
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(v)]
    assert len(frames) == 50
    assert np.abs(frames[10].astype(int) - gradient(10, 64, 48)).mean() < 3
    with av.open(str(path)) as c:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sr)
        got = np.concatenate(
            [o.to_ndarray()[0] for f in c.decode(audio=0) for o in resampler.resample(f)]
        )

    # AAC is lossy: compare loudness over time, not samples.
    def rms(x):
        return np.sqrt(np.mean(x[: (x.size // 640) * 640].reshape(-1, 640) ** 2, axis=1))

    n = min(got.size, audio.size) // 640
    assert np.corrcoef(rms(got)[:n], rms(audio)[:n])[0, 1] > 0.9
    assert leftovers(tmp_path) == []


def test_odd_size_is_cropped_to_even(tmp_path):
    path = write(tmp_path / "odd.mp4", 3, 65, 49)
    with av.open(str(path)) as c:
        assert (
            c.streams.video[0].codec_context.width,
            c.streams.video[0].codec_context.height,
        ) == (64, 48)


def test_error_leaves_final_path_untouched(tmp_path):
    path = tmp_path / "out.mp4"
    path.write_bytes(b"previous render")
    with pytest.raises(RuntimeError, match="boom"):
        with Mp4Writer(path, 64, 48, 25, audio=speech(1.0), sample_rate=16000) as wr:
            wr.write(gradient(0, 64, 48))
            assert len(leftovers(tmp_path)) == 1  # writing goes to a temp name ...
            raise RuntimeError("boom")
    assert path.read_bytes() == b"previous render"
    assert leftovers(tmp_path) == []  # ... which is removed on failure


def test_success_replaces_existing_file(tmp_path):
    path = tmp_path / "out.mp4"
    path.write_bytes(b"previous render")
    write(path, 5)
    with av.open(str(path)) as c:
        assert c.streams.video[0].frames == 5
    assert leftovers(tmp_path) == []


def test_bad_frames_and_empty_video_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"expected \(48, 64, 3\) uint8"):
        with Mp4Writer(tmp_path / "a.mp4", 64, 48, 25) as wr:
            wr.write(np.zeros((48, 65, 3), np.uint8))
    with pytest.raises(ValueError, match="no frames"):
        with Mp4Writer(tmp_path / "b.mp4", 64, 48, 25):
            pass
    with pytest.raises(ValueError, match="does not exist"):
        Mp4Writer(tmp_path / "missing" / "c.mp4", 64, 48, 25).open()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_rates():
    assert fps_fraction(25) == 25
    assert fps_fraction(30000 / 1001) == Fraction(30000, 1001)
    assert fps_fraction(Fraction(24000, 1001)) == Fraction(24000, 1001)
    with pytest.raises(ValueError, match="fps"):
        fps_fraction(0)
    assert (aac_rate(16000), aac_rate(22050), aac_rate(44100), aac_rate(48000)) == (
        48000,
        44100,
        44100,
        48000,
    )


def test_ntsc_rate_and_44k_audio(tmp_path):
    fps = 30000 / 1001
    sr = 44100
    seconds = 1.5
    n = round(seconds * fps)
    path = write(tmp_path / "ntsc.mp4", n, fps=fps, audio=speech(seconds, sr), sr=sr)
    with av.open(str(path)) as c:
        v, a = c.streams.video[0], c.streams.audio[0]
        assert v.average_rate == Fraction(30000, 1001) and a.rate == 44100
        assert abs(float(c.duration) / 1e6 - seconds) < 1 / fps
