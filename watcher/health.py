"""The daemon's pid lock and heartbeat, and what `hotplate status` says about them.

Both live in the cache (store) directory:

    watcher.lock   flock'ed exclusively while a daemon (or `hotplate sync`) runs; holds
                   its pid, personas folder and start time. The kernel drops the lock
                   when the process dies, kill -9 included, so a stale file never
                   blocks the next start.
    daemon.json    rewritten atomically every few seconds: pid, start time, folder,
                   mode, workers, queue, jobs done/failed, source states, last errors.
                   "stopped" is set on a clean exit.
    sync.json      the last `hotplate sync`: when, what became hot, what failed.

Reading them needs no LMDB, so `status` stays fast and never opens the store twice.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cachestore.atomic import atomic_write_text, held

LOCK_FILE = "watcher.lock"
HEARTBEAT_FILE = "daemon.json"
SYNC_FILE = "sync.json"
SERVER_WATCH = "hotplate serve --watch"  # a holder whose queue builds what sync would
HEARTBEAT_EVERY = 2.0  # seconds
UNRESPONSIVE_AFTER = 15.0  # a heartbeat older than this, with the lock held, is a hung daemon


class DaemonRunningError(RuntimeError):
    """Another watcher or sync holds this cache."""


class Lock:
    """An exclusive flock on <cache>/watcher.lock, naming its holder inside."""

    def __init__(self, cache: Path) -> None:
        self.path = Path(cache) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self, info: dict[str, Any], what: str = "hotplate watch") -> None:
        """Take the lock or raise DaemonRunningError naming the process that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        for attempt in range(5):  # a `status` may hold a shared lock for a moment
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if attempt == 4:
                    holder = read_json(self.path) or {}
                    os.close(fd)
                    raise DaemonRunningError(
                        f"cannot start {what}: {holder_text(holder)} already uses the cache "
                        f"{self.path.parent}; stop it first (kill {holder.get('pid', '?')}) or "
                        f"use another --cache"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**info, "pid": os.getpid()}).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def holder_text(holder: dict[str, Any]) -> str:
    what = holder.get("what", "a watcher")
    pid = holder.get("pid", "?")
    folder = holder.get("personas")
    since = holder.get("started")
    when = f", since {_clock(since)}" if since else ""
    return f"{what} (pid {pid}{', watching ' + folder if folder else ''}{when})"


def holder(cache: Path) -> dict[str, Any] | None:
    """What the process holding the watcher lock wrote in it, or None when none holds it."""
    if not lock_held(cache):
        return None
    return read_json(Path(cache) / LOCK_FILE) or {}


def lock_held(cache: Path) -> bool:
    """Whether some process holds the watcher lock now (without taking it for long)."""
    return held(Path(cache) / LOCK_FILE)


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Replace path atomically (a reader sees the old record or the new, never half)."""
    atomic_write_text(path, json.dumps(record, default=str))


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(Path(path).read_text() or "null")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_heartbeat(cache: Path, record: dict[str, Any]) -> None:
    write_json(Path(cache) / HEARTBEAT_FILE, {**record, "heartbeat": time.time()})


def beat(
    cache: Path,
    figures: Mapping[str, Any],
    rows: Iterable[Mapping[str, Any]],
    stopped: float | None = None,
) -> None:
    """Write daemon.json: the daemon's own figures and how many sources are in each state
    (`rows`: the `source` table's rows)."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.get("state", "?")] = counts.get(row.get("state", "?"), 0) + 1
    record = {**figures, "sources": counts}
    if stopped is not None:
        record["stopped"] = stopped
    write_heartbeat(cache, record)


def write_sync(
    cache: Path, personas: Path, results: Mapping[str, Mapping[str, Any]], unchanged: int
) -> None:
    """Write sync.json for the `hotplate sync` that ends now (`results`: rel -> its state)."""
    errors = [
        {"path": r, "error": v["error"]} for r, v in results.items() if v["state"] == "failed"
    ]
    write_json(
        Path(cache) / SYNC_FILE,
        {
            "time": time.time(),
            "personas": str(personas),
            "hot": sum(v["state"] == "hot" for v in results.values()),
            "failed": len(errors),
            "unchanged": unchanged,
            "errors": errors[:20],
        },
    )


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600:.0f} h {seconds % 3600 / 60:02.0f} min"
    return f"{seconds / 86400:.1f} days"


def describe(cache: str | os.PathLike) -> list[str]:
    """Lines for `hotplate status`: is a watcher running, how it is doing, what failed."""
    cache = Path(cache)
    beat = read_json(cache / HEARTBEAT_FILE)
    held = lock_held(cache)
    now = time.time()
    lines: list[str] = []
    if beat is None:
        holder = read_json(cache / LOCK_FILE) or {}
        if held:
            lines.append(f"watcher  starting: {holder_text(holder)}")
        else:
            lines.append("watcher  not running (start it with `hotplate watch`)")
    else:
        lines.extend(_describe_beat(beat, held, now))
    sync = read_json(cache / SYNC_FILE)
    if sync:
        lines.append(
            f"sync     last run {_clock(sync.get('time', 0))}: {sync.get('hot', 0)} became hot, "
            f"{sync.get('failed', 0)} failed, {sync.get('unchanged', 0)} already hot"
        )
        for err in sync.get("errors", [])[:5]:
            lines.append(f"         failed {err.get('path')}: {err.get('error')}")
    return lines


def _describe_beat(beat: dict[str, Any], held: bool, now: float) -> list[str]:
    pid, age = beat.get("pid", "?"), now - float(beat.get("heartbeat", 0))
    up = _age(now - float(beat.get("started", now)))
    if beat.get("stopped"):
        state = f"stopped at {_clock(beat['stopped'])} (pid {pid} exited cleanly after {up})"
    elif not held:
        state = (
            f"not running: stale heartbeat from pid {pid}, {_age(age)} old "
            f"(it was killed or crashed; `hotplate watch` starts a new one)"
        )
    elif age > UNRESPONSIVE_AFTER:
        state = f"unresponsive: pid {pid} holds the lock but its last heartbeat is {_age(age)} old"
    else:
        state = f"running, pid {pid}, up {up}, heartbeat {_age(age)} ago"
    lines = [f"watcher  {state}"]
    lines.append(
        f"         {beat.get('personas', '?')} ({beat.get('mode', '?')}, "
        f"{beat.get('workers', '?')} workers, settle {beat.get('settle', '?')} s)"
    )
    q = beat.get("queue", {})
    lines.append(
        f"         queue {q.get('running', 0)} running, {q.get('waiting', 0)} waiting, "
        f"{q.get('settling', 0)} settling; jobs done {beat.get('done', 0)}, "
        f"failed {beat.get('failed', 0)}, retried {beat.get('retried', 0)}"
    )
    states = beat.get("sources", {})
    if states:
        lines.append("sources  " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()) if n))
    for err in beat.get("errors", [])[-5:]:
        when = _age(now - float(err.get("time", now)))
        final = "gave up" if err.get("final") else f"attempt {err.get('attempts', '?')}"
        lines.append(f"error    {err.get('path')}: {err.get('error')} ({when} ago, {final})")
    return lines
