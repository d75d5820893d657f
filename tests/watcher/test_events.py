"""The name filter, the event values and the handler that only enqueues."""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

import pytest
from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
)

from watcher import events as ev
from watcher.events import Change, ChangeQueue, EnqueueHandler, judge, to_change

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

ROOT = Path("/srv/personas")


@pytest.mark.parametrize(
    ("rel", "kind", "reason"),
    [
        ("ruby/portrait.png", "still", ""),
        ("ruby/burgundy.JPG", "still", ""),
        ("ruby/burgundy.webp", "still", ""),
        ("ruby/burgundy.mp4", "loop", ""),
        ("ruby/burgundy/M1.mov", "loop", ""),
        ("ruby/burgundy/M1.MKV", "loop", ""),
        ("ruby/persona.toml", "options", ""),
        ("ruby/.burgundy.mp4.a1B2c3", None, "temp name"),  # rsync
        ("ruby/burgundy.mp4.tmp", None, "temp name"),
        ("ruby/burgundy.mp4.part", None, "temp name"),
        ("ruby/burgundy.mp4.crdownload", None, "temp name"),
        ("ruby/.burgundy.png.swp", None, "temp name"),
        ("ruby/burgundy.png~", None, "temp name"),
        ("ruby/.hidden.png", None, "hidden"),
        (".trash/ruby/portrait.png", None, "hidden"),
        ("ruby/.cache/M1.mp4", None, "hidden"),
        ("ruby/notes.txt", None, "not a supported image or video"),
        ("ruby/burgundy.gif", None, "not a supported image or video"),
        ("portrait.png", None, "not where the personas layout puts sources"),
        ("ruby/burgundy/still.png", None, "not where the personas layout puts sources"),
        ("ruby/a/b/M1.mp4", None, "not where the personas layout puts sources"),
        ("ruby/sub/persona.toml", None, "not a supported image or video"),
    ],
)
def test_judge(rel, kind, reason):
    verdict = judge(rel)
    assert (verdict.kind, verdict.reason) == (kind, reason)


def test_to_change_files():
    r = str(ROOT)
    assert to_change(FileCreatedEvent(f"{r}/ruby/a.png"), ROOT) == Change(ev.CREATED, "ruby/a.png")
    assert to_change(FileModifiedEvent(f"{r}/ruby/a.png"), ROOT) == Change(
        ev.MODIFIED, "ruby/a.png"
    )
    assert to_change(FileAttribEvent(f"{r}/ruby/a.png"), ROOT) == Change(ev.MODIFIED, "ruby/a.png")
    assert to_change(FileClosedEvent(f"{r}/ruby/a.png"), ROOT) == Change(ev.CLOSED, "ruby/a.png")
    assert to_change(FileDeletedEvent(f"{r}/ruby/a.png"), ROOT) == Change(ev.DELETED, "ruby/a.png")
    # reads are not subscribed, and would say nothing anyway
    assert to_change(FileOpenedEvent(f"{r}/ruby/a.png"), ROOT) is None
    assert to_change(FileClosedNoWriteEvent(f"{r}/ruby/a.png"), ROOT) is None
    # outside the folder
    assert to_change(FileCreatedEvent("/elsewhere/a.png"), ROOT) is None


def test_to_change_temp_names_and_moves():
    r = str(ROOT)
    tmp = f"{r}/ruby/.a.png.Xy12Zq"
    assert to_change(FileModifiedEvent(tmp), ROOT) == Change(
        ev.IGNORED, "ruby/.a.png.Xy12Zq", reason="temp name"
    )
    # rsync's rename: only the destination counts, as a new file
    assert to_change(FileMovedEvent(tmp, f"{r}/ruby/a.png"), ROOT) == Change(
        ev.MOVED, "", "ruby/a.png"
    )
    # a rename to a non-source name is the source's deletion
    assert to_change(FileMovedEvent(f"{r}/ruby/a.png", f"{r}/ruby/a.png.bak"), ROOT) == Change(
        ev.MOVED, "ruby/a.png", ""
    )
    # moved in from outside / out to outside (inotify full events)
    assert to_change(FileMovedEvent("", f"{r}/ruby/a.png"), ROOT) == Change(
        ev.MOVED, "", "ruby/a.png"
    )
    assert to_change(FileMovedEvent(f"{r}/ruby/a.png", "/tmp/a.png"), ROOT) == Change(
        ev.MOVED, "ruby/a.png", ""
    )
    assert to_change(FileMovedEvent(tmp, f"{r}/ruby/b.tmp"), ROOT).kind == ev.IGNORED


def test_to_change_dirs():
    r = str(ROOT)
    assert to_change(DirCreatedEvent(f"{r}/ruby"), ROOT) == Change(ev.DIR_CREATED, "ruby")
    assert to_change(DirDeletedEvent(f"{r}/ruby"), ROOT) == Change(ev.DIR_DELETED, "ruby")
    assert to_change(DirMovedEvent(f"{r}/ruby", f"{r}/rubi"), ROOT) == Change(
        ev.DIR_MOVED, "ruby", "rubi"
    )
    assert to_change(DirMovedEvent("", f"{r}/ruby"), ROOT) == Change(ev.DIR_MOVED, "", "ruby")
    assert to_change(DirDeletedEvent(r), ROOT) == Change(ev.DIR_DELETED, "")


def test_queue_drops_back_to_back_duplicates_and_wakes():
    q = ChangeQueue()
    try:
        a, b = Change(ev.MODIFIED, "ruby/a.png"), Change(ev.MODIFIED, "ruby/b.png")
        for change in (a, a, a, b, a):
            q.put(change)
        assert select.select([q], [], [], 0)[0] == [q]
        assert q.drain() == [a, b, a]
        assert q.dropped == 2
        assert select.select([q], [], [], 0)[0] == []
        q.put(a)  # after a drain the same change is news again
        assert q.drain() == [a]
    finally:
        q.close()


def test_queue_is_thread_safe():
    q = ChangeQueue()
    try:

        def produce(n: int) -> None:
            for i in range(500):
                q.put(Change(ev.MODIFIED, f"p{n}/{i}.png"))

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        got = []
        while any(t.is_alive() for t in threads) or len(q):
            got.extend(q.drain())
        for t in threads:
            t.join()
        got.extend(q.drain())
        assert len(got) == 2000 and len(set(got)) == 2000
    finally:
        q.close()


def test_handler_only_enqueues_and_reports_an_ignored_path_once():
    q = ChangeQueue()
    try:
        handler = EnqueueHandler(ROOT, q)
        tmp = f"{ROOT}/ruby/.a.png.Xy12Zq"
        for _ in range(3):
            handler.dispatch(FileModifiedEvent(tmp))
            handler.dispatch(FileModifiedEvent(f"{ROOT}/ruby/notes.txt"))
        handler.dispatch(FileClosedEvent(f"{ROOT}/ruby/a.png"))
        assert q.drain() == [
            Change(ev.IGNORED, "ruby/.a.png.Xy12Zq", reason="temp name"),
            Change(ev.IGNORED, "ruby/notes.txt", reason="not a supported image or video"),
            Change(ev.CLOSED, "ruby/a.png"),
        ]
    finally:
        q.close()


def test_real_observer_reports_a_copy_as_created_then_closed(tmp_path):
    """inotify end to end: a write is created, modified..., closed; reading it adds nothing."""
    root = tmp_path / "personas"
    (root / "ruby").mkdir(parents=True)
    q = ChangeQueue()
    observer, mode, warning = ev.start_observer(root, EnqueueHandler(root, q))
    try:
        assert (mode, warning) == ("inotify", "")
        target = root / "ruby" / "a.png"
        target.write_bytes(b"x" * 1000)

        def kinds() -> list[str]:
            got.extend(q.drain())
            return [c.kind for c in got if c.path == "ruby/a.png"]

        got: list[Change] = []
        deadline = time.monotonic() + 5
        while ev.CLOSED not in kinds() and time.monotonic() < deadline:
            select.select([q], [], [], 0.1)
        assert kinds()[0] == ev.CREATED and kinds()[-1] == ev.CLOSED
        got.clear()
        target.read_bytes()  # the daemon's own reads must not come back
        os.stat(target)
        select.select([q], [], [], 0.5)
        assert q.drain() == []
    finally:
        observer.stop()
        observer.join()
        q.close()


def test_polling_is_chosen_in_one_place(tmp_path):
    q = ChangeQueue()
    observer, mode, warning = ev.start_observer(tmp_path, EnqueueHandler(tmp_path, q), polling=True)
    try:
        assert mode == "polling" and warning == ""
    finally:
        observer.stop()
        observer.join()
        q.close()
