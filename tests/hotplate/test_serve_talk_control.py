"""A session's worker side (hotplate/serve/talk.py's TalkSession) on its real control
socket (talk_wire.py), as the server drives it, with a real Conversation: speech past
what the conversation queues is refused with an event that says why, and the session
and its control channel go on.

The server's pace check (sessions.py: 60 s ahead of the wall clock) lets a client get
there only when rendering is slower than real time, or after a minute with no peer;
here the test is the server, and pushes the speech at once."""

from __future__ import annotations

import asyncio
import os
import tempfile

import numpy as np

from hotplate.serve import talk_wire as wire
from hotplate.serve.talk import TalkSession
from pipeline.render.conversation import MAX_QUEUE_SECONDS, Conversation
from testkit.render_fixtures import build_assets, speech

RATE = 16000
PIECE = 10.0  # s of speech per PCM message (320 kB)


async def receive(reader: asyncio.StreamReader) -> dict:
    got = await asyncio.wait_for(wire.receive(reader), 20)
    assert got is not None, "the worker closed the control channel"
    return got[1]


def test_speech_past_the_queue_is_refused_and_the_session_keeps_its_control():
    assets = build_assets(6)
    pcm = np.clip(speech(PIECE, RATE) * 32767, -32768, 32767).astype("<i2").tobytes()
    pieces = int(MAX_QUEUE_SECONDS // PIECE) + 1  # the last one does not fit

    async def run() -> tuple[list[dict], dict, dict]:
        with tempfile.TemporaryDirectory() as folder, Conversation(assets) as conv:
            path = os.path.join(folder, "c.sock")
            session = TalkSession(conv, {"control": path}, None, lambda exc: 500)
            ready = asyncio.Event()
            job = asyncio.create_task(session.run(ready.set))
            await asyncio.wait_for(ready.wait(), 20)
            reader, writer = await asyncio.open_unix_connection(path)
            for _ in range(pieces):  # no peer: nothing plays, everything stays queued
                await wire.send_pcm(writer, RATE, 1, pcm)
            events = [await receive(reader)]  # the refusal, before any answer
            await wire.send_pcm(writer, RATE, 1, pcm[:3200])  # 0.1 s more: refused too
            events.append(await receive(reader))
            await wire.send_json(writer, {"op": "stats", "id": 1})
            stats = await receive(reader)
            await wire.send_json(writer, {"op": "interrupt"})  # the queue is emptied
            await wire.send_pcm(writer, RATE, 1, pcm)  # and takes speech again
            await wire.send_json(writer, {"op": "stats", "id": 2})
            again = await receive(reader)
            await wire.send_json(writer, {"op": "hangup", "why": "the test is done"})
            ended = await receive(reader)
            figures = await asyncio.wait_for(job, 20)
            writer.close()
            assert ended["event"] == "ended" and figures["why"] == "the test is done"
            return events, stats, again

    events, stats, again = asyncio.run(run())
    for event in events:
        assert event["event"] == "refused" and event["status"] == 429, event
        assert "\n" not in event["error"] and "speech refused" in event["error"], event
        assert f"{MAX_QUEUE_SECONDS:g} s of speech queued" in event["error"], event
    assert stats["id"] == 1
    assert stats["audio_seconds"] == (pieces - 1) * PIECE
    assert stats["refused_speech_seconds"] == PIECE + 0.1, stats
    assert stats["refused_speech"] == events[-1]["error"]
    assert again["audio_seconds"] == pieces * PIECE, again
    assert again["refused_speech_seconds"] == stats["refused_speech_seconds"], again
