"""A conversation session's speech WebSocket (the route is routes/sessions.py): the
format first, as text `{"sample_rate", "channels", "format": "s16le"}`, then binary PCM
as it is spoken, `{"type": "end_of_turn"}` between utterances and `{"type": "interrupt"}`.

What it holds is bounded (limits.py): one socket per session, the newer replacing the
older; no message for SPEECH_IDLE_TIMEOUT s closes it; text messages are checked for size
before they are parsed and for shape after; the session's end closes it at once. Every
refusal is a text message {"type": "error", "code", "detail"} and then a close frame
whose reason is the same one line, with a code from CLOSE_CODES (below): 1003 a kind of
message or a format it does not take, 1007 text that is not a flat JSON object (or not
UTF-8), 1008 no such session, speech too far ahead or refused by the worker (its queue
full: said to the next PCM or end_of_turn), 1009 a message over its limit,
1011 a server bug, 4408 idle, 4409 replaced by a newer socket, 4410 the session ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from hotplate.serve import limits
from hotplate.serve.problems import Problem

log = logging.getLogger("hotplate.serve")

UNSUPPORTED = 1003  # a message of a kind the socket does not take, or a format it cannot play
INVALID = 1007  # text that is not UTF-8, not JSON, or JSON of the wrong shape
POLICY = 1008  # no session of this client, speech too far ahead or refused, no format in time
TOO_BIG = 1009  # a message over its kind's limit (limits.py)
INTERNAL = 1011  # the server failed (a bug: the log has the one line)
IDLE = 4408  # no message for SPEECH_IDLE_TIMEOUT s
REPLACED = 4409  # a newer speech socket of the same session took this one's place
ENDED = 4410  # the session ended (its DELETE, its peer's, its limit): nothing more to say
CLOSE_CODES = frozenset({UNSUPPORTED, INVALID, POLICY, TOO_BIG, INTERNAL, IDLE, REPLACED, ENDED})
SAMPLE_RATES = (8000, 192000)
MAX_CHANNELS = 8


class Refused(Exception):
    """Close the socket with `code` and the one-line `detail`."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def check_format(rate: Any, channels: Any, fmt: Any = "s16le") -> tuple[int, int]:
    """(rate, channels) of a speech format; ValueError naming the field and the range."""
    if fmt != "s16le":
        raise ValueError(f"format {str(fmt)[:40]!r} is not supported; send 's16le' PCM")
    if type(rate) is not int or not SAMPLE_RATES[0] <= rate <= SAMPLE_RATES[1]:
        raise ValueError(
            f"sample_rate {str(rate)[:40]!r} must be an integer from {SAMPLE_RATES[0]} to "
            f"{SAMPLE_RATES[1]} Hz"
        )
    if type(channels) is not int or not 1 <= channels <= MAX_CHANNELS:
        raise ValueError(f"channels {str(channels)[:40]!r} must be 1 to {MAX_CHANNELS}")
    return rate, channels


def parse_text(message: dict) -> dict:
    """A text message as a flat JSON object: its size checked before it is parsed, its
    nesting after (a deep one is refused, never a RecursionError); Refused otherwise."""
    text = message.get("text")
    if text is None:
        raise Refused(UNSUPPORTED, "send the format and control messages as text JSON")
    if len(text) > limits.MAX_TEXT_MESSAGE or len(text.encode()) > limits.MAX_TEXT_MESSAGE:
        raise Refused(TOO_BIG, f"a text message is at most {limits.MAX_TEXT_MESSAGE} bytes")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise Refused(INVALID, "a text message must be a JSON object") from None
    if not isinstance(value, dict) or any(isinstance(v, dict | list) for v in value.values()):
        raise Refused(INVALID, "a text message must be a flat JSON object")
    return value


class SpeechSocket:
    """One open speech socket of a session; `close` may come from any task (the session
    ending, a newer socket)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.closing = False

    async def close(self, code: int, detail: str) -> None:
        """The error message, then a close frame with `code` and `detail` (one line)."""
        if self.closing:
            return
        self.closing = True
        with contextlib.suppress(Exception):  # the client is gone
            await self.ws.send_text(json.dumps({"type": "error", "code": code, "detail": detail}))
            await self.ws.close(code=code, reason=detail[:120])


async def serve(ws: Any, svc: Any, session_id: str, client: Any) -> None:
    """The speech socket, accepted, until it or its session closes (module doc)."""
    sessions = svc.sessions
    me = SpeechSocket(ws)
    s = None
    try:
        try:
            s = sessions.get(session_id, client)
        except Problem as exc:
            raise Refused(POLICY, exc.detail) from None
        sessions.attach_speech(s, me)
        first = await _receive(ws, limits.SPEECH_START_TIMEOUT, "no format message")
        if first is None:
            return
        start = parse_text(first)
        try:
            rate, channels = check_format(
                start.get("sample_rate"), start.get("channels", 1), start.get("format", "s16le")
            )
        except ValueError as exc:
            raise Refused(UNSUPPORTED, f"the first message must be the format: {exc}") from None
        while (msg := await _receive(ws, limits.SPEECH_IDLE_TIMEOUT, "no message")) is not None:
            if msg.get("bytes") is not None:
                data = msg["bytes"]
                if len(data) > limits.MAX_PCM_MESSAGE:
                    raise Refused(
                        TOO_BIG, f"a PCM message is at most {limits.MAX_PCM_MESSAGE} bytes"
                    )
                await sessions.pcm(s, rate, channels, data)
                continue
            kind = parse_text(msg).get("type")
            if kind == "end_of_turn":
                await sessions.end_of_turn(s)
            elif kind == "interrupt":
                await sessions.interrupt(s)
            else:
                raise Refused(
                    UNSUPPORTED, 'send binary PCM, {"type": "end_of_turn"} or "interrupt"'
                )
    except Refused as exc:
        await me.close(exc.code, exc.detail)
    except Problem as exc:  # the pace or the worker's queue (429), a session ended (404)
        await me.close(ENDED if exc.status == 404 else POLICY, exc.detail)
    except Exception as exc:  # noqa: BLE001 - a bug must still close with one line
        if type(exc).__name__ != "WebSocketDisconnect":
            log.exception("speech socket of session %s failed", session_id)
            await me.close(INTERNAL, "the server failed on this message; see its log")
    finally:
        if s is not None:
            sessions.detach_speech(s, me)


async def _receive(ws: Any, timeout: float, what: str) -> dict | None:
    """The next message, None once the client has gone; Refused past `timeout` s."""
    try:
        msg = await asyncio.wait_for(ws.receive(), timeout)
    except TimeoutError:
        code = POLICY if what == "no format message" else IDLE
        raise Refused(code, f"{what} within {timeout:g} s: closed; open another") from None
    if msg["type"] == "websocket.disconnect":
        return None
    return msg
