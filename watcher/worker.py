"""The worker process: runs precompile jobs one at a time, for as long as it lives.

Started with the spawn method (never fork: LMDB and torch must be opened fresh), it
opens the store once, keeps the models the pipeline loads (pipeline/nets/modelcache.py), and
answers each job on its pipe:

    parent -> worker   (job_id, path, recipe, stat)   or None to exit
    worker -> parent   ("ready", pid) once, then per job
                       ("ok", job_id, result) | ("changed", job_id, why) | ("error", job_id, why)
                       ("fatal", 0, why) when the job function cannot be loaded

A crash or a native abort kills only this process; the parent sees the pipe close and
the process sentinel fire, records the failure and starts another worker.

The job function is `module:function` (default `watcher.worker:precompile_job`) so tests
can inject one that raises or dies; it is called as fn(path, recipe, store) and
returns a dict with at least "digest" (the bytes it processed).
"""

from __future__ import annotations

import functools
import importlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachestore.flight import DEFAULT_WAIT
from cachestore.keys import FileChangedError, FileStat
from watcher.process import enter, messages, one_line

DEFAULT_JOB = "watcher.worker:precompile_job"
JobFn = Callable[..., dict]


def precompile_job(
    path: Path,
    recipe: Any,
    store: Any,
    flight_wait: float = DEFAULT_WAIT,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """The real job: pipeline.precompile.run.precompile_source on one source file (its
    avatar, and a video's mouth bank; a speech clip's bank alone)."""
    from pipeline.precompile.run import precompile_source

    report, bank = precompile_source(
        path, recipe, store, flight_wait=flight_wait, progress=progress
    )
    return {
        "digest": report.digest,
        "avatar": report.avatar,
        "hit": report.hit,
        "stages": [(s.name, s.hit, round(s.seconds, 3)) for s in report.stages],
        "frames": report.counts.get("frames"),
        "bank": None if bank is None else bank.avatar,
    }


def load_job(spec: str) -> JobFn:
    """The callable named by "module:function"; raises ValueError naming the spec."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"job={spec!r} must look like package.module:function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"job={spec!r} cannot be loaded ({exc}); check HOTPLATE_WATCH_JOB"
        ) from exc


# -- the process ------------------------------------------------------------------------


def worker_main(
    conn: Any,
    parent: int,
    cache: str,
    job_spec: str,
    map_size: int | None = None,
    flight_wait: float = DEFAULT_WAIT,
) -> None:
    """Entry point of a spawned worker."""
    if not enter(parent):
        return
    try:
        job = load_job(job_spec)
    except Exception as exc:
        conn.send(("fatal", 0, f"{type(exc).__name__}: {exc}"))
        return
    if job is precompile_job:  # the real job honours the flight_wait setting
        job = functools.partial(precompile_job, flight_wait=flight_wait)
    conn.send(("ready", os.getpid()))
    store = None
    for msg in messages(conn):
        job_id, path, recipe, stat = msg
        if store is None:
            from cachestore.store import open_store

            store = open_store(cache, map_size=map_size)
        conn.send(run_one(job, job_id, Path(path), recipe, store, stat))


def run_one(job: JobFn, job_id: int, path: Path, recipe: Any, store: Any, stat: dict) -> tuple:
    """One job, its outcome as a message (run_checked's rule)."""
    try:
        return ("ok", job_id, run_checked(job, path, recipe, store, stat))
    except FileChangedError as exc:
        return ("changed", job_id, str(exc))
    except Exception as exc:
        return ("error", job_id, one_line(exc))


def run_checked(job: JobFn, path: Path, recipe: Any, store: Any, stat: dict) -> dict:
    """One job's result, with its "seconds". The file must be the same before and after:
    FileChangedError when it changed or vanished meanwhile (the watcher settles it again);
    the job's own exception otherwise. `hotplate serve --watch`'s workers run this too."""
    start = time.perf_counter()
    try:
        result = dict(job(path, recipe, store) or {})
        now = FileStat.of(os.stat(path))
    except FileNotFoundError as exc:
        if not path.exists():
            raise FileChangedError(f"{path} vanished during the job") from exc
        raise
    if now != FileStat(**stat):
        raise FileChangedError(f"{path} changed during the job")
    result["seconds"] = time.perf_counter() - start
    return result
