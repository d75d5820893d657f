"""Job records: one SQLite file beside the store, and the data directory a server owns.

A job is queued, running, then done, failed or cancelled. Its record survives restarts:
at start, jobs a dead server left queued or running are marked failed with the reason.
Retention (`expire`, `trim`): videos leave the disk after `--keep-videos` or, oldest first,
when the data dir passes `--max-data-size`; their records say `expired` (410) for another
keep period, then go too (404). Nothing the server writes here grows without bound.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from cachestore.atomic import temps_of
from cachestore.flight import Holder

FINISHED = ("done", "failed", "cancelled", "expired", "interrupted")
CANCELLABLE = ("queued", "running")


@dataclass
class Job:
    id: str
    kind: str  # render or precompile
    persona: str
    attire: str
    motion: str | None
    backend: str
    created: float
    state: str = "queued"
    started: float | None = None
    finished: float | None = None
    step: str = ""
    done: int = 0
    total: int = 0
    jit: bool | None = None
    jit_seconds: float | None = None
    first_frame_seconds: float | None = None
    total_seconds: float | None = None
    audio_seconds: float | None = None
    avatar: str | None = None
    error: str | None = None
    status: int | None = None  # the HTTP status of a failure
    audio: str | None = None  # the uploaded file (deleted when the job ends)
    video: str | None = None  # the output (kept for the retention period)
    owner: str | None = None  # the client that created it (guard.client_id); may cancel it

    def __post_init__(self) -> None:
        if self.jit is not None:  # SQLite gives 0/1 back
            self.jit = bool(self.jit)

    def public(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("audio", "video")}
        out["progress"] = round(self.fraction(), 4)
        out["status_url"] = f"/v1/renders/{self.id}"
        if self.kind == "render" and self.state == "done":
            out["video_url"] = f"/v1/renders/{self.id}/video"
        return out

    def fraction(self) -> float:
        """Overall progress: a JIT precompile is the first half, the render the rest."""
        if self.state == "done":
            return 1.0
        part = self.done / self.total if self.total else 0.0
        if self.kind == "precompile":
            return part
        if self.step == "render":
            return 0.5 + 0.5 * part if self.jit else part
        return 0.5 * part if self.step else 0.0


COLUMNS = [f.name for f in fields(Job)]


@dataclass(frozen=True)
class Retention:
    """How long videos stay (`--keep-videos`) and how much the data dir may hold
    (`--max-data-size`, None: no cap); JobRecords.expire and trim apply them."""

    keep_s: float
    data: Path
    max_bytes: int | None = None


class JobRecords:
    """The jobs table, one SQLite file; safe to call from any thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.lock = threading.Lock()
        cols = ", ".join(f"{c} {'TEXT PRIMARY KEY' if c == 'id' else ''}" for c in COLUMNS)
        with self.lock:
            self.db.execute(f"CREATE TABLE IF NOT EXISTS jobs ({cols})")
            have = {row[1] for row in self.db.execute("PRAGMA table_info(jobs)")}
            for missing in (c for c in COLUMNS if c not in have):  # records of older servers
                self.db.execute(f"ALTER TABLE jobs ADD COLUMN {missing}")

    def save(self, job: Job) -> None:
        row = asdict(job)
        marks = ", ".join("?" for _ in COLUMNS)
        with self.lock:
            self.db.execute(
                f"INSERT OR REPLACE INTO jobs ({', '.join(COLUMNS)}) VALUES ({marks})",
                [row[c] for c in COLUMNS],
            )

    def get(self, job_id: str) -> Job | None:
        rows = self._select("WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def recent(self, limit: int = 50) -> list[Job]:
        return self._select("ORDER BY created DESC LIMIT ?", (limit,))

    def delete(self, job_id: str) -> None:
        with self.lock:
            self.db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def _select(self, where: str, args: tuple) -> list[Job]:
        with self.lock:
            rows = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM jobs {where}", args)
            return [Job(**dict(zip(COLUMNS, row, strict=True))) for row in rows.fetchall()]

    def fail_interrupted(self) -> list[Job]:
        """Mark what a dead server left queued or running as failed; returns those jobs."""
        left = self._select("WHERE state IN ('queued', 'running')", ())
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        for job in left:
            job.error = (
                f"the server stopped while this job was {job.state} (restarted {when}); "
                "submit it again"
            )
            job.state, job.status, job.finished = "failed", 503, time.time()
            remove(job.audio, job.video)
            job.audio = job.video = None
            self.save(job)
        return left

    def expire(self, now: float, keep_s: float) -> tuple[int, int]:
        """Retention by age: the video of a job finished more than `keep_s` ago leaves
        the disk and its record says `expired` (its video answers 410); a record finished
        more than another `keep_s` ago, or a failed one (it has no video) more than
        `keep_s` ago, is deleted (404). Returns (videos expired, records deleted)."""
        old = self._select(
            "WHERE finished IS NOT NULL AND finished < ? AND video IS NOT NULL", (now - keep_s,)
        )
        for job in old:
            self._expire(job)
        with self.lock:
            gone = self.db.execute(
                "DELETE FROM jobs WHERE finished IS NOT NULL AND "
                "((state = 'expired' AND finished < ?) OR "
                "(state NOT IN ('done', 'expired') AND finished < ?))",
                (now - 2 * keep_s, now - keep_s),
            ).rowcount
        return len(old), gone

    def trim(self, data: Path, max_bytes: int) -> int:
        """Retention by size: while the data dir holds more than `max_bytes`, the oldest
        finished video leaves the disk (record `expired`), but never the newest one, which
        its client may be fetching now. Returns how many videos went."""
        used = dir_bytes(data)
        if used <= max_bytes:
            return 0
        done = self._select("WHERE state = 'done' AND video IS NOT NULL ORDER BY finished", ())
        trimmed = 0
        for job in done[:-1]:
            if used <= max_bytes:
                break
            size = _size(job.video)
            self._expire(job)
            used -= size
            trimmed += 1
        return trimmed

    def _expire(self, job: Job) -> None:
        remove(job.video)
        job.video, job.state = None, "expired" if job.state == "done" else job.state
        self.save(job)


def dir_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (what its videos, uploads and records take)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            total += _size(os.path.join(root, name))
    return total


def _size(path: str | os.PathLike | None) -> int:
    try:
        return os.stat(path).st_size if path else 0
    except OSError:  # gone meanwhile
        return 0


def remove(*paths: str | None) -> None:
    """Delete these files and any partial copy of them a killed writer left beside them."""
    for p in paths:
        if p:
            for path in (Path(p), *temps_of(p)):
                path.unlink(missing_ok=True)


LOCK_NAME = "serve.lock"
_CLAIMED: dict[str, int] = {}  # data dir -> the fd holding its lock, for this process's life


class DataDirBusyError(RuntimeError):
    """Another `hotplate serve` uses this data directory."""


def claim_data_dir(data: Path) -> None:
    """Make this process the one server of `data` (job records, uploads, videos) for as
    long as it lives: two servers would fail each other's live jobs and delete their
    files. The kernel drops the lock when the process dies, kill -9 included. Then
    removes what a dead server left there: uploads and partial videos. Raises
    DataDirBusyError naming the other server's pid; calling it again is a no-op."""
    data.mkdir(parents=True, exist_ok=True)
    real = os.path.realpath(data)
    if real in _CLAIMED:
        return
    fd = os.open(data / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = Holder.read(fd)
        os.close(fd)
        raise DataDirBusyError(
            f"another hotplate serve ({holder or 'a process starting'}) uses {data}; "
            f"stop it, or give this server its own --data directory"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(Holder.me().record()).encode(), 0)
    _CLAIMED[real] = fd
    sweep_orphans(data)


def sweep_orphans(data: Path) -> None:
    """Files no live job owns: at start every upload is a dead server's, and so is every
    partial video (`.<id>.mp4.tmp-*`)."""
    for path in (data / "uploads").glob("*"):
        if path.is_file():
            path.unlink(missing_ok=True)
    for path in (data / "videos").glob(".*.tmp-*"):
        path.unlink(missing_ok=True)


def snapshot(job: Job) -> tuple:
    return (job.state, job.step, job.done, job.total)


def new_id(prefix: str = "") -> str:
    """A job id; `prefix` names the server that owns the job (a Ray replica's tag, so
    that any replica can route the job's requests to it)."""
    return f"{prefix}-{secrets.token_hex(8)}" if prefix else secrets.token_hex(8)
