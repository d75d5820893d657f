"""Media decoding: videos and stills to RGB frames, the store's frame codec, proxies.

Frames are numpy uint8 RGB (H, W, 3). Videos are streamed, one frame at a time, so
memory does not grow with the length of the video.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.personas import IMAGE_EXTS

log = logging.getLogger(__name__)

STILL_FPS = 25.0  # a still becomes a one-frame loop shown at this rate
REENCODE_HINT = "re-encode it, e.g. `ffmpeg -i IN -c:v libx264 -pix_fmt yuv420p OUT.mp4`"


class MediaError(ValueError):
    """A source file that cannot be decoded; the message names the file and the fix."""


@dataclass(frozen=True)
class MediaInfo:
    width: int
    height: int
    fps: float
    frames: int  # an estimate from the container for videos; 1 for stills
    is_still: bool
    codec: str


def is_still(path: str | Path) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTS


def has_audio(path: str | Path) -> bool:
    """Whether a video has an audio track (only its header is read)."""
    import av

    try:
        with av.open(str(path)) as container:
            return bool(container.streams.audio)
    except (av.error.FFmpegError, OSError):
        return False


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise MediaError(f"{path}: no such file; check the path")
    if path.stat().st_size == 0:
        raise MediaError(
            f"{path}: file is empty (0 bytes); copy it again, it may still be uploading"
        )


# ---------------------------------------------------------------------------- stills


def _exif_orientation(path: Path) -> int:
    """EXIF orientation tag (1-8), 1 when absent. IMREAD_UNCHANGED ignores it, so read it here."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            return int(im.getexif().get(0x0112, 1))
    except Exception:  # no PIL, or a header PIL cannot parse: cv2 has the pixels anyway
        return 1


# EXIF orientation -> how to turn stored pixels into displayed ones.
_ORIENT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: np.rot90(a, k=-1),
    7: lambda a: np.rot90(a, k=2).swapaxes(0, 1),
    8: lambda a: np.rot90(a, k=1),
}


def _to_rgb8(img: np.ndarray) -> np.ndarray:
    """Any cv2.imread(IMREAD_UNCHANGED) result -> RGB uint8; alpha composited onto white."""
    import cv2

    if img.dtype == np.uint16:
        img = ((img.astype(np.uint32) + 128) // 257).astype(np.uint8)
    elif img.dtype != np.uint8:
        img = (np.clip(img.astype(np.float32), 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
    if img.ndim == 2:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
    if img.shape[2] == 1:
        return cv2.cvtColor(img[..., 0], cv2.COLOR_GRAY2RGB)
    if img.shape[2] == 2:  # gray + alpha -> BGRA
        img = np.dstack([img[..., 0], img[..., 0], img[..., 0], img[..., 1]])
    if img.shape[2] == 4:
        alpha = img[..., 3:].astype(np.float32) / 255.0
        rgb = cv2.cvtColor(img[..., :3], cv2.COLOR_BGR2RGB).astype(np.float32)
        return (rgb * alpha + 255.0 * (1.0 - alpha) + 0.5).astype(np.uint8)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def read_still(path: str | Path) -> np.ndarray:
    """One image as RGB uint8, EXIF orientation applied."""
    import cv2

    path = Path(path)
    _check_file(path)
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise MediaError(f"{path}: not a readable image; save it again as PNG or JPEG")
    rgb = _to_rgb8(img)
    return np.ascontiguousarray(_ORIENT.get(_exif_orientation(path), _ORIENT[1])(rgb))


# ---------------------------------------------------------------------------- videos


class _CannotOpen(Exception):
    pass


def _rotate(img: np.ndarray, degrees: float) -> np.ndarray:
    """Apply a display-matrix rotation (degrees counter-clockwise, as PyAV reports it)."""
    k = int(round(degrees / 90.0)) % 4
    return np.ascontiguousarray(np.rot90(img, k=k)) if k else img


def _iter_pyav(path: Path, max_frames: int) -> Iterator[np.ndarray]:
    import av

    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, ValueError) as err:
        raise _CannotOpen(str(err)) from err
    with container:
        if not container.streams.video:
            raise MediaError(f"{path}: has no video stream; use a video or an image file")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        n = 0
        try:
            for frame in container.decode(stream):
                yield _rotate(frame.to_ndarray(format="rgb24"), frame.rotation or 0)
                n += 1
                if max_frames and n >= max_frames:
                    return
        except av.FFmpegError as err:
            if n == 0:
                raise MediaError(
                    f"{path}: no decodable frames ({err}); the file may be truncated "
                    f"or still copying; copy it again or {REENCODE_HINT}"
                ) from err
            log.warning("%s: decoding stopped after %d frames (%s); using those", path, n, err)
        if n == 0:
            raise MediaError(f"{path}: no decodable frames; copy it again or {REENCODE_HINT}")


def _iter_cv2(path: Path, max_frames: int, why: str) -> Iterator[np.ndarray]:
    import cv2

    cap = cv2.VideoCapture(str(path))
    try:
        n = 0
        while cap.isOpened():
            ok, bgr = cap.read()
            if not ok:
                break
            yield cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            n += 1
            if max_frames and n >= max_frames:
                return
        if n == 0:
            raise MediaError(f"{path}: not a readable video ({why}); {REENCODE_HINT}")
    finally:
        cap.release()


def _iter_video(path: Path, max_frames: int) -> Iterator[np.ndarray]:
    try:
        yield from _iter_pyav(path, max_frames)
    except _CannotOpen as err:  # PyAV could not open it at all: let OpenCV try
        yield from _iter_cv2(path, max_frames, str(err))


def iter_frames(path: str | Path, max_frames: int = 0) -> Iterator[np.ndarray]:
    """Stream RGB uint8 frames from a video or a still, at most `max_frames` (0 = all).

    Raises MediaError (a missing or empty file at once; an undecodable one on the first
    frame). A video that breaks off after some frames yields those and logs a warning.
    """
    path = Path(path)
    _check_file(path)
    if max_frames < 0:
        raise ValueError(f"max_frames={max_frames} must be >= 0 (0 = all frames)")
    if is_still(path):
        return iter([read_still(path)])
    return _iter_video(path, max_frames)


def probe(path: str | Path) -> MediaInfo:
    """Size, rate, frame estimate and codec; decodes the first frame so a bad file fails here."""
    path = Path(path)
    _check_file(path)
    if is_still(path):
        img = read_still(path)
        return MediaInfo(img.shape[1], img.shape[0], STILL_FPS, 1, True, path.suffix.lower()[1:])
    first = next(iter_frames(path, max_frames=1))
    height, width = first.shape[:2]
    try:
        import av

        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            fps = float(rate) if rate else 0.0
            frames = int(stream.frames or 0)
            if not frames and stream.duration and stream.time_base and fps:
                frames = int(round(float(stream.duration * stream.time_base) * fps))
            if not frames and container.duration and fps:
                frames = int(round(container.duration / 1_000_000 * fps))
            codec = stream.codec_context.name
    except Exception:  # only OpenCV could open it
        import cv2

        cap = cv2.VideoCapture(str(path))
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        codec = "opencv"
        cap.release()
    return MediaInfo(width, height, fps or STILL_FPS, max(frames, 1), False, codec)


# ---------------------------------------------------------------------------- frame codec

# The stored frames' format (bench/bench_hot_path.py measures the candidates): the I420
# planes x264 takes (BT.601 limited range, as cv2.COLOR_RGB2YUV_I420 makes them) in a JPEG
# at quality 95, 4:2:0. FFmpeg's JPEG decoder hands them back as yuv420p planes ready for
# the encoder, with no colour conversion either way (~6 ms a 1080x1920 frame, against
# ~19 ms for the JPEG 4:4:4 decode to RGB plus its conversion to I420), at 0.7x the bytes.
# The JPEG carries the comment "CS=ITU601", FFmpeg's own mark for limited-range planes, so
# any FFmpeg-based reader gets the colours right, and `decode_frame` tells it apart.
FRAME_CODEC = "i420-jpeg-q95"
# Formats older avatars hold: still read (and rendered) until they are rebuilt.
LEGACY_CODECS = ("jpeg-q95-444",)
FRAME_CODECS = (FRAME_CODEC, *LEGACY_CODECS)
_COMMENT = b"CS=ITU601\x00"
I420_MARK = b"\xff\xd8\xff\xfe" + (len(_COMMENT) + 2).to_bytes(2, "big") + _COMMENT


def _encode_params(codec: str) -> tuple[str, list[int]]:
    import cv2

    return {
        "jpeg-q95-444": (
            ".jpg",
            [
                cv2.IMWRITE_JPEG_QUALITY,
                95,
                cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
            ],
        ),
        "png-1": (".png", [cv2.IMWRITE_PNG_COMPRESSION, 1]),
        "webp-lossless": (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101]),
    }[codec]


def encode_frame(rgb: np.ndarray, codec: str | None = None) -> bytes:
    """Encode an RGB uint8 frame for the store (`codec`: FRAME_CODEC unless given)."""
    import cv2

    codec = codec or FRAME_CODEC
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"encode_frame: expected (H, W, 3) uint8 RGB, got {rgb.shape} {rgb.dtype}")
    if codec == "i420-jpeg-q95":
        import simplejpeg

        from pipeline.yuv import i420_of_rgb

        y, u, v = (np.ascontiguousarray(p) for p in i420_of_rgb(rgb))
        data = simplejpeg.encode_jpeg_yuv_planes(y, u, v, quality=95)
        return I420_MARK + data[2:]  # the comment right after the start-of-image marker
    ext, params = _encode_params(codec)
    ok, buf = cv2.imencode(ext, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), params)
    if not ok:
        raise ValueError(f"encode_frame: OpenCV failed to encode {rgb.shape} as {codec}")
    return buf.tobytes()


def _as_bytes(data: bytes | memoryview | np.ndarray) -> np.ndarray:
    return (
        data.reshape(-1).view(np.uint8)
        if isinstance(data, np.ndarray)
        else np.frombuffer(data, np.uint8)
    )


def is_i420(data: bytes | memoryview | np.ndarray) -> bool:
    """Whether `data` is a frame in the I420 JPEG format (FRAME_CODEC)."""
    return _as_bytes(data)[: len(I420_MARK)].tobytes() == I420_MARK


_decoders = threading.local()  # one FFmpeg JPEG decoder per thread and reduction


def _jpeg_decoder(lowres: int = 0):
    import av

    ctx = getattr(_decoders, f"mjpeg{lowres}", None)
    if ctx is None:
        ctx = av.CodecContext.create("mjpeg", "r")
        if lowres:
            ctx.options = {"lowres": str(lowres)}
        setattr(_decoders, f"mjpeg{lowres}", ctx)
    return ctx


def _decode_i420(buf: np.ndarray, lowres: int = 0):
    import av

    try:
        frames = _jpeg_decoder(lowres).decode(av.Packet(buf.tobytes()))
    except av.FFmpegError as err:
        raise ValueError(f"decode_frame: {buf.size} bytes are not a stored frame ({err})") from err
    if len(frames) != 1 or frames[0].format.name not in ("yuv420p", "yuv444p", "yuv440p"):
        raise ValueError(f"decode_frame: {buf.size} bytes did not decode to one I420 frame")
    if frames[0].format.name != "yuv420p":  # FFmpeg's choice for a frame 1 px wide or high
        from pipeline.yuv import frame_from_planes, planes

        return frame_from_planes(*planes(frames[0]))
    return frames[0]


def decode_yuv(data: bytes | memoryview | np.ndarray):
    """Decode a stored frame to an I420 `av.VideoFrame` (pipeline/yuv.py), any format:
    the I420 JPEG straight to its planes, an older avatar's RGB frames converted."""
    buf = _as_bytes(data)
    if is_i420(buf):
        return _decode_i420(buf)
    from pipeline.yuv import frame_from_rgb

    return frame_from_rgb(decode_frame(buf))


def decode_frame(data: bytes | memoryview | np.ndarray) -> np.ndarray:
    """Decode any frame encode_frame wrote (the format is read from the bytes) to RGB uint8."""
    import cv2

    buf = _as_bytes(data)
    if is_i420(buf):
        from pipeline.yuv import to_rgb

        return to_rgb(_decode_i420(buf))
    rgb = cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB)
    if rgb is None:
        raise ValueError(f"decode_frame: {buf.size} bytes are not an encoded frame")
    return rgb


def decode_proxy(
    data: bytes | memoryview | np.ndarray, full_side: int, proxy: int = 480
) -> tuple[np.ndarray, float]:
    """make_proxy(decode_frame(data)) but cheaper: JPEG decodes straight to 1/2, 1/4 or 1/8
    size (DCT scaling) when that still leaves the longer side >= proxy px.

    full_side is the full frame's longer side; the scale returned is relative to it.
    """
    import cv2

    reduce = next((r for r in (8, 4, 2) if full_side / r >= proxy), 1)
    if reduce == 1:
        return make_proxy(decode_frame(data), proxy)
    buf = _as_bytes(data)
    if is_i420(buf):
        from pipeline.yuv import to_rgb

        rgb = to_rgb(_decode_i420(buf, lowres={2: 1, 4: 2, 8: 3}[reduce]))
    else:
        flag = {
            2: cv2.IMREAD_REDUCED_COLOR_2,
            4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8,
        }[reduce]
        bgr = cv2.imdecode(buf, flag)
        if bgr is None:
            raise ValueError(f"decode_proxy: {buf.size} bytes are not an encoded frame")
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    image, scale = make_proxy(rgb, proxy)
    return image, scale * max(rgb.shape[:2]) / full_side


def make_proxy(frame: np.ndarray, proxy: int = 480) -> tuple[np.ndarray, float]:
    """Downscale so the longer side is `proxy` px (never upscale); return (image, scale)."""
    import cv2

    height, width = frame.shape[:2]
    scale = min(1.0, proxy / max(height, width))
    if scale >= 1.0:
        return frame, 1.0
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(frame, size, interpolation=cv2.INTER_AREA), scale
