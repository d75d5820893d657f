"""What the observer reports, reduced to small immutable values, and the handler that
only enqueues them.

watchdog's observer thread calls `EnqueueHandler.dispatch`; it turns the event into a
`Change` (pure string work: no stat, no hashing) and puts it on a `ChangeQueue`, which
drops back-to-back duplicates (an `IN_MODIFY` storm from one copy is one change) and
wakes the daemon loop through a pipe. Every decision that needs the disk is the
daemon's, on its own thread.

`judge(rel)` is the one name filter: the daemon's events, its reconcile scan and
`hotplate sync` all use it, so they agree on what is a source.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from pipeline.personas import IMAGE_EXTS, MEDIA_EXTS, VIDEO_EXTS

# Only what can change a source. Opened / closed-without-write are left out so the
# daemon's and the workers' own reads never come back as events.
EVENT_TYPES: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileAttribEvent,  # rsync --inplace and `touch` set mtime after the last write
    FileClosedEvent,  # IN_CLOSE_WRITE: the writer is done
    FileMovedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]

OPTIONS_FILE = "persona.toml"
TEMP_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".download", ".swp", ".swx", "~")
RSYNC_TEMP = re.compile(r"^\..+\.[A-Za-z0-9_]{6}$")  # rsync's .name.XXXXXX

# Change kinds
CREATED, MODIFIED, CLOSED, MOVED, DELETED = "created", "modified", "closed", "moved", "deleted"
DIR_CREATED, DIR_MOVED, DIR_DELETED = "dir-created", "dir-moved", "dir-deleted"
IGNORED, OVERFLOW = "ignored", "overflow"


@dataclass(frozen=True)
class Verdict:
    kind: str | None  # "still", "loop", "options", or None when ignored
    reason: str = ""  # why it is ignored


def judge(rel: str | PurePosixPath) -> Verdict:
    """Is this personas-relative path a source, a persona.toml, or something to ignore?

    Sources sit where pipeline.personas' layout puts them: `<persona>/<file>` (still or
    loop) or `<persona>/<attire>/<motion>.<video>`.
    """
    parts = PurePosixPath(rel).parts
    if not parts:
        return Verdict(None, "the personas folder itself")
    name = parts[-1]
    if RSYNC_TEMP.match(name) or name.lower().endswith(TEMP_SUFFIXES):
        return Verdict(None, "temp name")
    if any(p.startswith(".") for p in parts):
        return Verdict(None, "hidden")
    if len(parts) == 2 and name == OPTIONS_FILE:
        return Verdict("options")
    suffix = PurePosixPath(name).suffix.lower()
    if suffix not in MEDIA_EXTS:
        return Verdict(None, "not a supported image or video")
    if len(parts) == 2:
        return Verdict("still" if suffix in IMAGE_EXTS else "loop")
    if len(parts) == 3 and suffix in VIDEO_EXTS:
        return Verdict("loop")
    return Verdict(None, "not where the personas layout puts sources")


def relative(root: Path, path: str) -> str | None:
    """path relative to root in posix form, or None when it is not below root."""
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return None
    if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
        return None
    return PurePosixPath(*Path(rel).parts).as_posix()


@dataclass(frozen=True)
class Change:
    """One thing the observer saw. Paths are personas-relative (posix)."""

    kind: str
    path: str = ""
    dest: str = ""  # moves only; "" when moved out of the tree
    reason: str = ""  # IGNORED only


class ChangeQueue:
    """Thread-safe FIFO of changes that drops back-to-back duplicates and wakes a loop.

    `fileno()` is the read end of a pipe that becomes readable after each put, so the
    daemon can wait on it together with its worker connections.
    """

    def __init__(self) -> None:
        self._items: deque[Change] = deque()
        self._lock = threading.Lock()
        self._last: Change | None = None
        self._rfd, self._wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.dropped = 0

    def put(self, change: Change) -> None:
        with self._lock:
            if change == self._last:
                self.dropped += 1
                return
            self._last = change
            self._items.append(change)
        self.wake()

    def __len__(self) -> int:
        return len(self._items)

    def wake(self) -> None:
        try:
            os.write(self._wfd, b"\0")
        except (BlockingIOError, OSError):  # full pipe: the loop is awake already
            pass

    def drain(self) -> list[Change]:
        try:
            while os.read(self._rfd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._last = None
            return items

    def fileno(self) -> int:
        return self._rfd

    def close(self) -> None:
        for fd in (self._rfd, self._wfd):
            try:
                os.close(fd)
            except OSError:
                pass


def to_change(event: FileSystemEvent, root: Path) -> Change | None:
    """The Change for one watchdog event, or None when it says nothing about sources."""
    src = relative(root, os.fsdecode(event.src_path)) if event.src_path else None
    dest_path = getattr(event, "dest_path", "")
    dest = relative(root, os.fsdecode(dest_path)) if dest_path else None
    if event.is_directory:
        if isinstance(event, DirMovedEvent):
            if src is None and dest is None:
                return None
            return Change(DIR_MOVED, src or "", dest or "")
        if src is None:
            return Change(DIR_DELETED, "") if isinstance(event, DirDeletedEvent) else None
        kind = {DirCreatedEvent: DIR_CREATED, DirDeletedEvent: DIR_DELETED}.get(type(event))
        return Change(kind, src) if kind else None
    if isinstance(event, FileMovedEvent):
        src_ok = src is not None and judge(src).kind is not None
        dest_ok = dest is not None and judge(dest).kind is not None
        if not (src_ok or dest_ok):
            name = dest or src
            return Change(IGNORED, name, reason=judge(name).reason) if name else None
        return Change(MOVED, src if src_ok else "", dest if dest_ok else "")
    if src is None:
        return None
    verdict = judge(src)
    if verdict.kind is None:
        return Change(IGNORED, src, reason=verdict.reason)
    kind = {
        FileCreatedEvent: CREATED,
        FileModifiedEvent: MODIFIED,
        FileAttribEvent: MODIFIED,
        FileClosedEvent: CLOSED,
        FileDeletedEvent: DELETED,
    }.get(type(event))
    return Change(kind, src) if kind else None


class EnqueueHandler(FileSystemEventHandler):
    """Runs on the observer thread: converts and enqueues, nothing else.

    An ignored path is enqueued once (so the daemon logs the decision once), not for
    every write rsync makes to its temp file.
    """

    def __init__(self, root: Path, queue: ChangeQueue, remember: int = 4096) -> None:
        self.root = Path(root)
        self.queue = queue
        self._ignored: OrderedDict[str, None] = OrderedDict()
        self._remember = remember

    def dispatch(self, event: FileSystemEvent) -> None:
        change = to_change(event, self.root)
        if change is None:
            return
        if change.kind == IGNORED:
            if change.path in self._ignored:
                return
            self._ignored[change.path] = None
            if len(self._ignored) > self._remember:
                self._ignored.popitem(last=False)
        self.queue.put(change)


class OverflowSignal(logging.Handler):
    """watchdog logs (and does not report) an inotify queue overflow; turn that log
    record into an OVERFLOW change so the daemon reconciles what it missed."""

    def __init__(self, queue: ChangeQueue) -> None:
        super().__init__(logging.WARNING)
        self.queue = queue

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self.queue.put(Change(OVERFLOW))


def start_observer(
    root: Path, handler: EnqueueHandler, polling: bool = False, interval: float = 1.0
) -> tuple[object, str, str]:
    """Schedule and start the observer: the one place the platform backend is chosen.

    Returns (observer, mode, warning). mode is "inotify" (readiness from IN_CLOSE_WRITE),
    "native" (another OS's API; readiness from size and mtime) or "polling". warning
    is "" unless the native backend failed (no inotify, watch limit reached) and
    polling stands in for it.
    """
    from watchdog.observers.polling import PollingObserver

    def schedule(observer: object, mode: str) -> tuple[object, str]:
        observer.schedule(handler, str(root), recursive=True, event_filter=EVENT_TYPES)
        observer.start()
        return observer, mode

    if polling:
        return (*schedule(PollingObserver(timeout=interval), "polling"), "")
    try:
        if sys.platform.startswith("linux"):
            from watchdog.observers.inotify import InotifyObserver

            # full events: a file moved in from outside arrives as a move (complete),
            # not as a create that would wait for a close that never comes
            return (*schedule(InotifyObserver(generate_full_events=True), "inotify"), "")
        from watchdog.observers import Observer

        return (*schedule(Observer(), "native"), "")
    except (ImportError, OSError) as exc:
        warning = (
            f"native file events are not available ({exc}); polling {root} every "
            f"{interval:g} s instead (raise fs.inotify.max_user_watches to fix)"
        )
        return (*schedule(PollingObserver(timeout=interval), "polling"), warning)
