"""uvicorn's WebSocket protocol as `hotplate serve` runs it (drain.py): uvicorn's own
sans-I/O `websockets` one, which closes a message over `ws_max_size` with 1009 and a
reason, except that a text message that is not UTF-8 gets a 1007 close with a one-line
reason and one log line, where uvicorn sends no reason and logs a traceback; and a
refused message (over `ws_max_size`: 1009) leaves the connection open for reading, its
close frame sent and the sending side shut, until the client closes it (or
`close_timeout`): uvicorn closed it at once, and the client's next bytes then reset the
connection, which destroyed the close frame before the client had read it.

It reaches into uvicorn's protocol class (its `frames`, `curr_msg_data_type`, `conn`):
`protocol()` falls back to uvicorn's choice ("auto") when that class is not there.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("hotplate.serve")
NOT_UTF8 = "a text message must be UTF-8"


def protocol() -> Any:
    """The protocol class for uvicorn.Config(ws=...), or "auto"."""
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import (
            WebSocketsSansIOProtocol,
        )
    except ImportError:
        return "auto"

    class CheckedText(WebSocketsSansIOProtocol):
        def send_receive_event_to_app(self) -> None:
            if self.curr_msg_data_type == "text" and not self.close_sent:
                try:
                    b"".join(self.frames).decode()
                except UnicodeDecodeError as exc:
                    self.frames = []
                    log.info(
                        "websocket %s: %s (%s)",
                        getattr(self, "scope", {}).get("path"),
                        NOT_UTF8,
                        exc,
                    )
                    self._close_gently(1007, NOT_UTF8)
                    return
            super().send_receive_event_to_app()

        def data_received(self, data: bytes) -> None:
            if self.close_sent and self.conn.parser_exc is not None:
                self.conn.receive_data(data)  # dropped: the connection is failing
                return
            super().data_received(data)

        def handle_parser_exception(self) -> None:
            sent = self.conn.close_sent
            code, reason = (sent.code, sent.reason) if sent is not None else (1002, "")
            self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.close_sent = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            if self.read_paused:
                self.read_paused = False
                self.transport.resume_reading()
            self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)

        def _close_gently(self, code: int, reason: str) -> None:
            """As uvicorn closes for the app: the close frame now, what the client still
            sends dropped until its close frame ends the handshake (or a timeout). A
            connection cut at once would reset under the client's next message and
            lose the close frame before the client reads it."""
            self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
            self.conn.send_close(code, reason)
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.close_sent = True
            if self.read_paused:
                self.read_paused = False
                self.transport.resume_reading()
            self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)

    required = ("send_receive_event_to_app", "handle_close", "handle_parser_exception")
    if not all(hasattr(WebSocketsSansIOProtocol, name) for name in required):
        return "auto"
    return CheckedText
