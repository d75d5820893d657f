"""One line per decision: plain text for a terminal, JSON lines with --json.

Every line has an event name (see EVENTS), usually a personas-relative path, and a
short message; JSON lines add the fields as they are, for `jq` and log shippers.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

EVENTS = (
    "start",  # the daemon is up: mode, folder, workers
    "warning",  # e.g. inotify unavailable, polling instead
    "ignore",  # a path that is not a source (temp name, hidden, not media, ...)
    "settle",  # a path started waiting to be still
    "ready",  # a path is still: hashed, and what happens next
    "hot",  # a path is hot with no work (same content is hot already, a rename)
    "gone",  # a path was deleted or moved away: its row is dropped
    "moved",  # a rename inside the tree
    "reconcile",  # a full scan and what it found
    "queued",  # a new job, or (with a `same_as` field) a file joining one of the same content
    "job-start",
    "job-done",
    "job-retry",
    "job-failed",  # gave up after the last attempt
    "stop",
)


class Log:
    """A `log(event, path="", msg="", **fields)` callable writing to a stream."""

    def __init__(self, json_lines: bool = False, stream: TextIO | None = None) -> None:
        self.json_lines = json_lines
        self.stream = stream
        self._lock = threading.Lock()

    def __call__(self, event: str, path: str = "", msg: str = "", **fields: Any) -> None:
        now = time.time()
        if self.json_lines:
            record = {"time": round(now, 3), "event": event, "path": path, "msg": msg, **fields}
            line = json.dumps(record, default=str)
        else:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            line = f"{stamp}  {event:<10} {path + '  ' if path else ''}{msg}".rstrip()
        stream = self.stream or sys.stdout
        with self._lock:
            stream.write(line + "\n")
            stream.flush()


def quiet(event: str, path: str = "", msg: str = "", **fields: Any) -> None:
    """A log that drops everything."""
