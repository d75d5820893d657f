"""The control channel between the server and the render worker that holds a
conversation session (talk.py): a Unix socket in a directory only the server's user
can enter, one connection, messages framed as

    length (4 bytes, big-endian) | kind (1 byte) | payload (length bytes)

kind 0: UTF-8 JSON (an operation, its answer, an event); kind 1: PCM, whose payload is
sample rate (4 bytes) | channels (1 byte) | s16le interleaved samples.

server -> worker: {"op": "offer", "id", "sdp"} -> {"id", "sdp"} | {"id", "error", "status"};
                  {"op": "switch", "id", "persona", "attire", "motion"} -> {"id"} | error;
                  {"op": "candidates", "id", "sdpfrag"} -> {"id", "added"} | error;
                  {"op": "stats", "id"} -> {"id", ...figures};
                  {"op": "interrupt", "id"?} -> {"id"} when it has an id;
                  {"op": "end_of_turn"}, {"op": "hangup", "why"}; PCM.
worker -> server: the answers, and {"event": "connected"}, {"event": "ended", "why"},
                  {"event": "refused", "error", "status"} (speech past its queue).
"""

from __future__ import annotations

import asyncio
import json
import struct

from hotplate.serve.limits import MAX_WIRE_MESSAGE

JSON, PCM = 0, 1
HEAD = struct.Struct(">IB")
PCM_HEAD = struct.Struct(">IB")
# bytes: the largest message the server sends (limits.py: a PCM message or an offer,
# framed); one over it is a broken channel, not speech
MAX_MESSAGE = MAX_WIRE_MESSAGE


async def send_json(writer: asyncio.StreamWriter, message: dict) -> None:
    data = json.dumps(message).encode()
    writer.write(HEAD.pack(len(data), JSON) + data)
    await writer.drain()


async def send_pcm(writer: asyncio.StreamWriter, rate: int, channels: int, pcm: bytes) -> None:
    writer.write(HEAD.pack(PCM_HEAD.size + len(pcm), PCM) + PCM_HEAD.pack(rate, channels))
    writer.write(pcm)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> tuple[int, object] | None:
    """(JSON, dict) or (PCM, (rate, channels, bytes)); None at the end of the stream."""
    try:
        head = await reader.readexactly(HEAD.size)
        length, kind = HEAD.unpack(head)
        if length > MAX_MESSAGE:
            raise ValueError(f"a control message of {length} bytes is over {MAX_MESSAGE}")
        payload = await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    if kind == PCM:
        rate, channels = PCM_HEAD.unpack(payload[: PCM_HEAD.size])
        return PCM, (rate, channels, payload[PCM_HEAD.size :])
    return JSON, json.loads(payload)
