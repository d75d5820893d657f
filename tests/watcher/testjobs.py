"""Job functions the workers run in tests instead of precompile (HOTPLATE_WATCH_JOB or
Config.job). They act on the file's name, so one daemon can see every kind of outcome:

    *boom*   raises ValueError
    *die*    the worker SIGKILLs itself (a crash the daemon must survive)
    *abort*  os.abort() (a native abort)
    *slow*   sleeps HOTPLATE_TEST_SLOW seconds (default 30) first
    *grow*   appends to the file the first time (a writer that was not done)
    anything else: recorded, and its avatar made hot with tiny stand-in stages, so the
                   store says what a real precompile would leave (the avatar is there)

Every call appends one JSON line to $HOTPLATE_TEST_JOBLOG: the path, the xxh3 of the
bytes it read, start and end times, the worker pid.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import xxhash


def _log(record: dict) -> None:
    target = os.environ.get("HOTPLATE_TEST_JOBLOG")
    if target:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def record(path: Path, recipe, store) -> dict:
    start = time.time()
    name = Path(path).name
    _log({"event": "start", "path": str(path), "start": start, "pid": os.getpid()})
    if "slow" in name:
        time.sleep(float(os.environ.get("HOTPLATE_TEST_SLOW", "30")))
    if "boom" in name:
        raise ValueError(f"{name} is not a face this test likes")
    if "die" in name:
        os.kill(os.getpid(), signal.SIGKILL)
    if "abort" in name:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from the test
        os.abort()
    data = Path(path).read_bytes()
    digest = xxhash.xxh3_128_hexdigest(data)
    if "grow" in name and not data.endswith(b"grown"):  # as if mid-decode
        with open(path, "ab") as f:
            f.write(b"grown")
    make_hot(store, digest, recipe)
    _log(
        {
            "event": "done",
            "path": str(path),
            "digest": digest,
            "start": start,
            "end": time.time(),
            "pid": os.getpid(),
        }
    )
    return {"digest": digest}


def make_hot(store, digest: str, recipe) -> str:
    """Stage and avatar manifests for the planned keys, with one tiny array each."""
    import numpy as np

    from pipeline.precompile.plan import plan

    p = plan(digest, recipe)
    for name, key in p.stages.items():
        store.put_stage(key, name, {"x": np.zeros(4, np.uint8)}, {})
    store.put_avatar(p.avatar, {"stages": p.stages, "source_digest": digest, "frames": 1})
    return p.avatar


def read_joblog(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
