"""What a render worker runs for the streaming routes (kinds "stream" and "live").

The worker and the server share the job's files, not its bytes over the pipe:

- the output, `videos/<job>.mp4`, is a fragmented MP4 the worker appends whole
  segments to (init, then one fragment at a time, flushed); the server sends each
  segment once it is complete in the file (`SegmentReader`);
- live input, `uploads/<job>.pcm.part`, is the PCM the server appends as it arrives.
  The server renames it to `<job>.pcm` when the client sends its end message, and
  deletes it when the client goes away: the worker reads to the end of the file and
  looks which of the two happened.

So a slow client holds back only disk bytes (bounded by the audio limit), never the
worker's or the server's memory, and the job protocol on the pipe is unchanged.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PCM_POLL = 0.01  # s: how often the worker looks for more live input
PART = ".part"


class ClientGone(ValueError):
    """The live client went away before its end message."""


def pcm_chunks(part: Path, idle_timeout: float = 120.0) -> Iterator[bytes]:
    """The bytes of a live input file as the server appends them, until it is renamed
    from `x.pcm.part` to `x.pcm` (the end); raises ClientGone when it is deleted."""
    final = part.with_name(part.name.removesuffix(PART))
    try:
        f = open(part, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        if not final.exists():
            raise ClientGone("the live client went away before the render started") from None
        f = open(final, "rb")  # noqa: SIM115
    with f:
        quiet_since = time.monotonic()
        while True:
            data = f.read(1 << 16)
            if data:
                quiet_since = time.monotonic()
                yield data
                continue
            if final.exists():  # ended: what is left was written before the rename
                while data := f.read(1 << 16):
                    yield data
                return
            # the end's rename may fall between the check above and this one: gone
            # only if neither name is there
            if not part.exists() and not final.exists():
                raise ClientGone("the live client went away mid-stream")
            if time.monotonic() - quiet_since > idle_timeout:
                raise ClientGone(f"no live input for {idle_timeout:g} s")
            time.sleep(PCM_POLL)


class SegmentReader:
    """The segments of a fragmented MP4 that another process is appending to, one at a
    time: a client that reads slowly makes its reader hold one segment, never the
    backlog the render has made meanwhile."""

    PAIRS = {b"ftyp": b"moov", b"moof": b"mdat"}  # a segment: the init, or one fragment

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.f = None

    def read(self) -> bytes | None:
        """The next whole segment (ftyp+moov, moof+mdat, or any other top-level box
        alone) once every byte of it is in the file; None until then."""
        if self.f is None:
            try:
                self.f = open(self.path, "rb")  # noqa: SIM115 - closed in close()
            except FileNotFoundError:
                return None
        size = os.fstat(self.f.fileno()).st_size
        first = self._box_at(self.offset, size)
        if first is None:
            return None
        kind, length = first
        if kind in self.PAIRS:  # a moof travels with its mdat, ftyp with its moov
            second = self._box_at(self.offset + length, size)
            if second is None:
                return None
            length += second[1]
        self.f.seek(self.offset)
        segment = self.f.read(length)
        self.offset += length
        return segment

    def _box_at(self, at: int, size: int) -> tuple[bytes, int] | None:
        """(type, length) of the box starting at `at` if the file holds all of it."""
        if size - at < 8:
            return None
        self.f.seek(at)
        head = self.f.read(16)
        length, kind = struct.unpack(">I4s", head[:8])
        if length == 1:
            if len(head) < 16:
                return None
            length = struct.unpack(">Q", head[8:16])[0]
        if length < 8:
            raise ValueError(f"{self.path} has a bad MP4 box at byte {at}")
        return (kind, length) if at + length <= size else None

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


def _children(box: bytes, start: int) -> Iterator[tuple[bytes, bytes]]:
    at = start
    while at + 8 <= len(box):
        size, kind = struct.unpack(">I4s", box[at : at + 8])
        if size < 8:
            return
        yield kind, box[at + 8 : at + size]
        at += size


def fragment_samples(fragment: bytes, track: int = 1) -> int:
    """Samples of `track` (1: the video, the first stream the writer adds) in a
    moof+mdat fragment: the sum of its trun sample counts."""
    if fragment[4:8] != b"moof":
        return 0
    moof = fragment[: struct.unpack(">I", fragment[:4])[0]]
    total = 0
    for kind, traf in _children(moof, 8):
        if kind != b"traf":
            continue
        tid, count = None, 0
        for sub, body in _children(traf, 0):
            if sub == b"tfhd":
                tid = struct.unpack(">I", body[4:8])[0]
            elif sub == b"trun":
                count += struct.unpack(">I", body[4:8])[0]
        if tid == track:
            total += count
    return total


def run_live_job(store: Any, settings: dict[str, Any], fields: dict, recipe: Any, progress) -> dict:
    """One "live" job (PCM read from the growing upload); returns its result. A "stream"
    job is a render job inside `streaming_to` (workers.run_job)."""
    personas = Path(settings["personas"])
    from pipeline.lip_sync import LipSyncRequest, live_lip_sync

    out_path = Path(fields["output"])
    request = LipSyncRequest(
        fields["persona"],
        fields["attire"],
        Path(fields["pcm"]),
        out_path,
        motion=fields.get("motion"),
        backend=fields["backend"],
        profile=fields.get("profile"),
    )
    with open(out_path, "wb") as out:

        def sink(kind: str, data: bytes) -> None:
            out.write(data)
            out.flush()
            progress.segment(kind, data)  # the server sends it now, not at its next look

        try:
            report = live_lip_sync(
                store,
                personas,
                recipe,
                request,
                pcm_chunks(Path(fields["pcm"])),
                int(fields["sample_rate"]),
                int(fields["channels"]),
                sink,
                default_loop=settings["loop"],
                progress=progress,
                flight_wait=settings["flight_wait"],
                on_jit=progress.jit,
            )
        except BaseException:
            out.close()
            os.unlink(out_path)
            raise
    return {
        "avatar": report.avatar,
        "jit": report.jit,
        "jit_seconds": report.jit_seconds,
        "first_frame_seconds": report.first_fragment_seconds,
        "frames": report.frames,
        "audio_seconds": report.audio_seconds,
        "fragments": report.fragments,
        "end_lag_seconds": report.end_lag_seconds,
        "timings": report.timings,
    }
