"""Readiness: when a file that changed is safe to hash and precompile.

A file is ready when its size, mtime, ctime and inode have been still for `settle`
seconds and, where the backend reports closes (inotify), the current inode was seen
closed after writing (IN_CLOSE_WRITE) or renamed into place. A file that is still
and unclosed for `open_grace` seconds is ready too: a hard link, or a close event
lost to an overflow, must not wait forever.

The clock and stat are parameters, so the rules are tested without sleeping.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Look = tuple[int, int, int, int]  # (inode, size, mtime_ns, ctime_ns)


@dataclass
class Pending:
    rel: str
    since: float  # monotonic time of the last event or observed stat change
    look: Look | None = None  # the stat last seen
    closed_ino: int | None = None  # inode seen closed-after-write or renamed into place


def look_of(st: os.stat_result) -> Look:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Settler:
    """Paths waiting to become still.

    note() on every event; due() returns (ready, vanished) and keeps the rest;
    next_deadline() says when to call due() again.
    """

    def __init__(
        self,
        root: Path,
        settle: float,
        need_close: bool,
        open_grace: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        stat: Callable[[Path], os.stat_result] = os.stat,
    ) -> None:
        if settle < 0:
            raise ValueError(f"settle={settle} must be >= 0 seconds")
        self.root = Path(root)
        self.settle = settle
        self.need_close = need_close
        self.open_grace = max(4 * settle, 2.0) if open_grace is None else open_grace
        self.clock, self.stat = clock, stat
        self.pending: dict[str, Pending] = {}

    def __len__(self) -> int:
        return len(self.pending)

    def __contains__(self, rel: str) -> bool:
        return rel in self.pending

    def note(
        self,
        rel: str,
        closed: bool = False,
        quiet_since: float | None = None,
    ) -> bool:
        """Record an event on rel; returns True when rel was not pending before.

        closed: the writer is done with the file as it is now (a close after writing,
        a rename into place, a file found by a scan). quiet_since: for scanned files,
        the monotonic time the file last changed, so an old file need not wait.
        A deleted path must be forgotten (the daemon does it on the delete event):
        inode numbers are reused at once, so a close seen for the old file would
        otherwise count for a new one.
        """
        now = self.clock()
        entry = self.pending.get(rel)
        new = entry is None
        if entry is None:
            entry = self.pending[rel] = Pending(rel, now)
        entry.since = now if quiet_since is None else min(now, quiet_since)
        try:
            st = self.stat(self.root / rel)
        except OSError:
            entry.look = None  # gone or unreadable: due() decides
            return new
        entry.look = look_of(st)
        if closed:
            entry.closed_ino = st.st_ino
        return new

    def forget(self, rel: str) -> None:
        self.pending.pop(rel, None)

    def forget_under(self, prefix: str) -> list[str]:
        """Drop every pending path at or below prefix ("" = everything)."""
        gone = [r for r in self.pending if not prefix or r == prefix or r.startswith(prefix + "/")]
        for r in gone:
            del self.pending[r]
        return gone

    def _closed(self, entry: Pending) -> bool:
        if not self.need_close:
            return True
        return entry.look is not None and entry.closed_ino == entry.look[0]

    def _wait(self, entry: Pending) -> float:
        return self.settle if self._closed(entry) else self.open_grace

    def next_deadline(self) -> float | None:
        if not self.pending:
            return None
        return min(e.since + self._wait(e) for e in self.pending.values())

    def due(self) -> tuple[list[str], list[str]]:
        """(ready, vanished): paths to hash now, and paths that no longer exist.

        Both leave the pending set. A path whose stat moved since the last look stays,
        with its quiet period restarted.
        """
        now = self.clock()
        ready: list[str] = []
        vanished: list[str] = []
        for rel, entry in list(self.pending.items()):
            if now < entry.since + self._wait(entry):
                continue
            try:
                st = self.stat(self.root / rel)
            except FileNotFoundError:
                vanished.append(rel)
                del self.pending[rel]
                continue
            except OSError:  # unreadable for now (permissions mid-copy): look again later
                entry.since = now
                continue
            seen = look_of(st)
            if seen != entry.look:  # still being written (or replaced): start over
                entry.look, entry.since = seen, now
                continue
            ready.append(rel)
            del self.pending[rel]
        return ready, vanished
