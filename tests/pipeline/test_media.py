import logging
import os

import cv2
import numpy as np
import pytest

from hotplate import demo_data as synthetic
from pipeline import media
from pipeline.media import MediaError, decode_frame, encode_frame, iter_frames, make_proxy, probe

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

SMALL = (180, 320)  # width, height


@pytest.fixture(scope="module")
def small_frames():
    return list(synthetic.iter_loop_frames(12, size=SMALL))


@pytest.fixture(scope="module")
def small_video(tmp_path_factory, small_frames):
    return synthetic.write_loop_video(
        tmp_path_factory.mktemp("v") / "loop.mp4", small_frames, fps=30
    )


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * np.log10(255**2 / mse) if mse else np.inf


# ------------------------------------------------------------------ videos


def test_full_size_video_round_trip(tmp_path):
    frames, _ = synthetic.make_loop_frames(6)
    path = synthetic.write_loop_video(tmp_path / "hd.mp4", frames, fps=25)
    info = probe(path)
    assert (info.width, info.height, info.fps, info.frames) == (1080, 1920, 25.0, 6)
    assert not info.is_still and info.codec == "h264"
    decoded = list(iter_frames(path))
    assert len(decoded) == 6 and decoded[0].shape == (1920, 1080, 3)
    assert decoded[0].dtype == np.uint8
    assert psnr(decoded[3], frames[3]) > 33


def test_small_video_fps_count_and_cap(small_video, small_frames):
    info = probe(small_video)
    assert (info.width, info.height, info.fps, info.frames) == (180, 320, 30.0, 12)
    assert len(list(iter_frames(small_video))) == 12
    assert len(list(iter_frames(small_video, max_frames=5))) == 5
    assert len(list(iter_frames(small_video, max_frames=100))) == 12
    with pytest.raises(ValueError, match="max_frames"):
        iter_frames(small_video, max_frames=-1)


def test_mkv_and_temporary_names(tmp_path, small_frames):
    mkv = synthetic.write_loop_video(tmp_path / "a.mkv", small_frames[:3])
    assert probe(mkv).frames == 3 and len(list(iter_frames(mkv))) == 3
    part = synthetic.write_loop_video(tmp_path / ".b.mp4.part", small_frames[:3])
    assert part.read_bytes()[4:8] == b"ftyp"  # still an MP4 under a temporary name


def test_one_frame_video(tmp_path, small_frames):
    one = synthetic.write_loop_video(tmp_path / "one.mp4", small_frames[:1])
    assert probe(one).frames == 1
    assert len(list(iter_frames(one))) == 1


def test_display_rotation_is_applied_like_opencv(tmp_path, small_frames):
    import av

    path = tmp_path / "rot.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 180, 320, "yuv420p"
        s.set_display_rotation(90)
        for f in small_frames[:2]:
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    ours = next(iter_frames(path))
    ok, bgr = cv2.VideoCapture(str(path)).read()  # OpenCV rotates by the display matrix too
    assert ok and ours.shape == (180, 320, 3)
    assert np.abs(ours.astype(int) - cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)).mean() < 1.0
    assert probe(path).width == 320


@pytest.mark.parametrize(
    "make",
    [
        lambda p, good: p.write_bytes(np.random.default_rng(0).bytes(60_000)),
        lambda p, good: p.write_bytes(good.read_bytes()[: good.stat().st_size // 2]),
        lambda p, good: p.write_bytes(b"\x00" * 10),
    ],
    ids=["random-bytes", "truncated-mp4", "tiny"],
)
def test_bad_videos_raise_media_error_naming_the_file(tmp_path, small_video, make):
    bad = tmp_path / "bad.mp4"
    make(bad, small_video)
    with pytest.raises(MediaError, match="bad.mp4"):
        list(iter_frames(bad))
    with pytest.raises(MediaError, match="bad.mp4"):
        probe(bad)


def test_empty_and_missing_files_fail_at_once(tmp_path):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(MediaError, match=r"empty\.mp4.*empty"):
        iter_frames(empty)  # eager: no need to start iterating
    with pytest.raises(MediaError, match="nothere.png"):
        iter_frames(tmp_path / "nothere.png")


def test_truncated_stream_yields_what_decoded(tmp_path, small_frames, caplog):
    # Matroska has its index up front, so half a file still decodes its first frames.
    good = synthetic.write_loop_video(tmp_path / "good.mkv", small_frames)
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with caplog.at_level(logging.WARNING):
        frames = list(iter_frames(cut))
    assert 1 <= len(frames) < 12
    assert psnr(frames[0], small_frames[0]) > 30


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_frames_stream_in_bounded_memory(tmp_path):
    """600 frames would be 233 MB held at once; streaming keeps resident memory flat."""
    size = (480, 270)
    video = synthetic.write_loop_video(
        tmp_path / "long.mp4", n_frames=600, size=size, preset="ultrafast"
    )
    frames = iter_frames(video)
    next(frames)
    base = peak = _rss()
    count = 1
    for _ in frames:
        count += 1
        peak = max(peak, _rss())
    assert count == 600
    total = 600 * size[0] * size[1] * 3
    assert peak - base < total // 4, f"resident memory grew {(peak - base) >> 20} MiB"


def test_opencv_fallback_reads_video(small_video):
    frames = list(media._iter_cv2(small_video, 0, "test"))
    assert len(frames) == 12 and frames[0].shape == (320, 180, 3)
    assert len(list(media._iter_cv2(small_video, 4, "test"))) == 4


# ------------------------------------------------------------------ stills


def test_still_png_and_jpeg(tmp_path):
    box = synthetic.write_still(tmp_path / "p.png", size=(360, 640))
    info = probe(tmp_path / "p.png")
    assert (info.width, info.height, info.frames, info.is_still) == (360, 640, 1, True)
    (frame,) = iter_frames(tmp_path / "p.png", max_frames=0)
    assert frame.shape == (640, 360, 3) and box[2] > box[0]
    synthetic.write_still(tmp_path / "p.jpg", size=(360, 640))
    assert psnr(next(iter_frames(tmp_path / "p.jpg")), frame) > 35


def test_landscape_still(tmp_path):
    synthetic.write_still(tmp_path / "wide.png", size=(1920, 1080))
    assert next(iter_frames(tmp_path / "wide.png")).shape == (1080, 1920, 3)


def test_png_alpha_is_composited_on_white(tmp_path):
    bgra = np.zeros((4, 6, 4), np.uint8)
    bgra[..., :3] = (255, 0, 0)  # blue in BGR
    bgra[:, :3, 3] = 255  # left half opaque, right half transparent
    bgra[0, 0, 3] = 128
    cv2.imwrite(str(tmp_path / "a.png"), bgra)
    rgb = next(iter_frames(tmp_path / "a.png"))
    assert rgb.shape == (4, 6, 3)
    assert tuple(rgb[1, 1]) == (0, 0, 255)
    assert tuple(rgb[1, 5]) == (255, 255, 255)
    assert tuple(rgb[0, 0]) == (127, 127, 255)


def test_gray_alpha_png(tmp_path):
    from PIL import Image

    la = np.zeros((2, 2, 2), np.uint8)
    la[0, 0] = (100, 255)  # opaque gray
    la[1, 1] = (0, 0)  # transparent
    Image.fromarray(la, mode="LA").save(tmp_path / "la.png")
    rgb = next(iter_frames(tmp_path / "la.png"))
    assert tuple(rgb[0, 0]) == (100, 100, 100) and tuple(rgb[1, 1]) == (255, 255, 255)


def test_grayscale_and_16bit_png(tmp_path):
    gray = np.arange(48, dtype=np.uint8).reshape(6, 8) * 5
    cv2.imwrite(str(tmp_path / "g.png"), gray)
    rgb = next(iter_frames(tmp_path / "g.png"))
    assert rgb.shape == (6, 8, 3) and (rgb == gray[..., None]).all()
    deep = np.zeros((4, 4, 3), np.uint16)
    deep[..., 0], deep[..., 1], deep[..., 2] = 65535, 257 * 100, 300  # B, G, R
    cv2.imwrite(str(tmp_path / "d.png"), deep)
    rgb = next(iter_frames(tmp_path / "d.png"))
    assert rgb.dtype == np.uint8 and tuple(rgb[0, 0]) == (1, 100, 255)


def _asymmetric(h=40, w=60):
    img = np.zeros((h, w, 3), np.uint8)
    img[: h // 4, : w // 3] = (255, 0, 0)  # red block top-left
    img[-h // 4 :, -w // 5 :] = (0, 255, 0)  # green block bottom-right
    return img


def test_jpeg_exif_orientation_6_is_honoured(tmp_path):
    from PIL import Image, ImageOps

    path = tmp_path / "phone.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(_asymmetric()).save(path, exif=exif, quality=95)
    ours = next(iter_frames(path))
    with Image.open(path) as im:
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert ours.shape == (60, 40, 3) == expected.shape  # rotated to portrait
    assert np.abs(ours.astype(int) - expected).mean() < 3
    assert probe(path).width == 40


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_matches_pillow(tmp_path, orientation):
    from PIL import Image, ImageOps

    path = tmp_path / "o.png"
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(_asymmetric()).save(path, exif=exif)
    with Image.open(path) as im:
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    np.testing.assert_array_equal(next(iter_frames(path)), expected)


def test_unreadable_image_names_the_file(tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(os.urandom(500))
    with pytest.raises(MediaError, match="broken.png"):
        probe(bad)


# ------------------------------------------------------------------ frame codec and proxy


def test_frame_codec_round_trip(small_frames):
    frame, _ = synthetic.make_loop_frames(1)
    data = encode_frame(frame[0])
    assert isinstance(data, bytes) and len(data) < frame[0].nbytes // 5
    for wrapped in (data, memoryview(data), np.frombuffer(data, np.uint8)):
        out = decode_frame(wrapped)
        assert out.shape == frame[0].shape and out.dtype == np.uint8
        assert psnr(out, frame[0]) > 40
        assert np.abs(out.astype(int) - frame[0]).max() < 40
    assert media.FRAME_CODEC == "i420-jpeg-q95" and media.is_i420(data)
    png = encode_frame(small_frames[0], codec="png-1")
    np.testing.assert_array_equal(decode_frame(png), small_frames[0])  # lossless, read by magic


@pytest.mark.parametrize("size", [(180, 320), (181, 321), (1, 1), (3, 2)])
def test_i420_frames_are_the_encoders_planes(size):
    """The stored planes are cv2's I420 of the frame (what the encoder used to be given),
    within the JPEG's rounding, at odd sizes too; FFmpeg reads them as limited-range
    yuv420p, and the older format still decodes."""
    from pipeline.yuv import i420_of_rgb, planes, to_rgb

    w, h = size
    frame = synthetic.render_frame(synthetic.loop_params(1, (w, h))[0], (w, h))
    legacy = encode_frame(frame, codec="jpeg-q95-444")
    assert not media.is_i420(legacy)
    assert psnr(decode_frame(legacy), frame) > 35
    for data in (encode_frame(frame), legacy):
        stored = media.decode_yuv(data)
        assert (stored.width, stored.height, stored.format.name) == (w, h, "yuv420p")
        for got, want in zip(planes(stored), i420_of_rgb(frame), strict=True):
            assert got.shape == want.shape
            assert np.abs(got.astype(int) - want).mean() < 3  # JPEG q95 rounding
        assert to_rgb(stored).shape == frame.shape
        assert psnr(to_rgb(stored), frame) > 30  # what I420 keeps of RGB


def test_i420_proxy_decodes_reduced():
    frame = synthetic.render_frame(synthetic.loop_params(1)[0])
    proxy, scale = media.decode_proxy(encode_frame(frame), 1920, 480)
    want, want_scale = make_proxy(frame, 480)
    assert proxy.shape == want.shape and scale == pytest.approx(want_scale)
    assert psnr(proxy, want) > 30


def test_frame_codec_rejects_bad_input():
    with pytest.raises(ValueError, match="decode_frame"):
        decode_frame(b"not an image")
    with pytest.raises(ValueError, match="encode_frame"):
        encode_frame(np.zeros((4, 4), np.uint8))


def test_make_proxy():
    frame = np.zeros((1920, 1080, 3), np.uint8)
    proxy, scale = make_proxy(frame, 480)
    assert proxy.shape == (480, 270, 3) and scale == 0.25
    small = np.zeros((200, 100, 3), np.uint8)
    same, scale = make_proxy(small, 480)
    assert same is small and scale == 1.0
    wide, scale = make_proxy(np.zeros((1080, 1920, 3), np.uint8), 480)
    assert wide.shape == (270, 480, 3) and scale == 0.25
