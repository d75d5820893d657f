"""Readiness rules on real files, with a hand-driven clock."""

from __future__ import annotations

import os

import pytest

from watcher.settle import Settler

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock():
    return Clock()


def make(tmp_path, clock, need_close=True, settle=1.0, open_grace=5.0):
    return Settler(tmp_path, settle, need_close=need_close, open_grace=open_grace, clock=clock)


def test_closed_file_is_ready_after_settle(tmp_path, clock):
    s = make(tmp_path, clock)
    (tmp_path / "a.png").write_bytes(b"abc")
    assert s.note("a.png") is True
    assert s.note("a.png", closed=True) is False
    assert s.next_deadline() == clock.t + 1.0
    clock.advance(0.99)
    assert s.due() == ([], [])
    clock.advance(0.02)
    assert s.due() == (["a.png"], [])
    assert len(s) == 0 and s.next_deadline() is None


def test_an_event_restarts_the_quiet_period(tmp_path, clock):
    s = make(tmp_path, clock)
    (tmp_path / "a.png").write_bytes(b"abc")
    s.note("a.png", closed=True)
    clock.advance(0.8)
    s.note("a.png")  # a modify (or attrib) after the close
    clock.advance(0.8)
    assert s.due() == ([], [])
    clock.advance(0.3)
    assert s.due() == (["a.png"], [])


def test_unclosed_file_waits_for_the_open_grace(tmp_path, clock):
    s = make(tmp_path, clock)
    (tmp_path / "a.png").write_bytes(b"abc")
    s.note("a.png")  # created, written, never seen closed (a hard link, a lost close)
    clock.advance(1.5)
    assert s.due() == ([], [])
    clock.advance(4.0)
    assert s.due() == (["a.png"], [])


def test_a_stat_change_without_an_event_restarts(tmp_path, clock):
    s = make(tmp_path, clock, need_close=False)
    f = tmp_path / "a.mp4"
    f.write_bytes(b"abc")
    s.note("a.mp4")
    clock.advance(1.1)
    with open(f, "ab") as h:  # a writer whose events were lost
        h.write(b"more")
    assert s.due() == ([], [])
    assert s.next_deadline() == pytest.approx(clock.t + 1.0)
    clock.advance(1.1)
    assert s.due() == (["a.mp4"], [])


def test_polling_needs_no_close(tmp_path, clock):
    s = make(tmp_path, clock, need_close=False)
    (tmp_path / "a.png").write_bytes(b"abc")
    s.note("a.png")
    clock.advance(1.0)
    assert s.due() == (["a.png"], [])


def test_a_file_deleted_and_written_again_is_not_closed(tmp_path, clock):
    s = make(tmp_path, clock)
    f = tmp_path / "a.png"
    f.write_bytes(b"old")
    s.note("a.png", closed=True)
    f.unlink()
    s.forget("a.png")  # the daemon's answer to the delete event
    f.write_bytes(b"new, still being written")  # a new file, no close seen for it yet
    s.note("a.png")
    clock.advance(1.1)
    assert s.due() == ([], [])
    s.note("a.png", closed=True)
    clock.advance(1.1)
    assert s.due() == (["a.png"], [])


def test_vanished_files_are_reported(tmp_path, clock):
    s = make(tmp_path, clock)
    (tmp_path / "a.png").write_bytes(b"abc")
    s.note("a.png", closed=True)
    os.unlink(tmp_path / "a.png")
    clock.advance(1.1)
    assert s.due() == ([], ["a.png"])
    assert len(s) == 0


def test_scanned_old_files_are_ready_at_once(tmp_path, clock):
    s = make(tmp_path, clock)
    (tmp_path / "old.png").write_bytes(b"abc")
    (tmp_path / "new.png").write_bytes(b"abc")
    s.note("old.png", closed=True, quiet_since=clock.t - 60)
    s.note("new.png", closed=True, quiet_since=clock.t - 0.2)
    assert s.due() == (["old.png"], [])
    clock.advance(0.85)
    assert s.due() == (["new.png"], [])


def test_forget_under(tmp_path, clock):
    s = make(tmp_path, clock)
    for rel in ("ruby/a.png", "ruby/red/M1.mp4", "rubyx/a.png"):
        s.note(rel)
    assert sorted(s.forget_under("ruby")) == ["ruby/a.png", "ruby/red/M1.mp4"]
    assert "rubyx/a.png" in s
    s.forget("rubyx/a.png")
    assert len(s) == 0


def test_settle_must_not_be_negative(tmp_path):
    with pytest.raises(ValueError, match="settle=-1"):
        Settler(tmp_path, -1, need_close=True)
