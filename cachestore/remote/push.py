"""Push a hot avatar to the blob tier: blobs first, then its manifest.

Each blob is checked against its own digest before it leaves (a damaged local blob is
not spread), named by its SHA-256, and skipped when the tier already holds an object of
that name and size (one HEAD each). The manifest goes last, so a reader that finds it
finds every blob it names. Two stores pushing the same avatar at once write the same
blob bytes under the same names; each PUT is atomic, so the later one wins whole.

The manifest (JSON, under `ac/`): {"body": {...}, "sha256": hex of the canonical body}
with body = {"hotplate": 1, "avatar": key, "record": the avatar record (without its
local times), "stages": {stage key: stage record}, "blobs": {xxh3: [sha256, size]}}.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import xxhash

from cachestore import codec
from cachestore.errors import StoreError
from cachestore.keys import canonical
from cachestore.remote.tier import Remote, RemoteError, ac_path, cas_path, sha256
from cachestore.store import Store

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 1
PARALLEL = 4  # objects in flight at once; loopback and LAN tiers saturate at a few
BACKGROUND_JOIN = 60.0  # seconds a finishing process waits for its background pushes

# progress(done_bytes, total_bytes)
Progress = Callable[[int, int], None]


class NotHotError(StoreError):
    """The avatar asked for is not (wholly) in the local store."""


@dataclass
class PushReport:
    avatar: str
    blobs: int = 0  # blobs the avatar names
    sent: int = 0  # blobs uploaded (the rest were on the tier already)
    bytes_sent: int = 0
    seconds: float = 0.0


def manifest_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps({"body": body, "sha256": sha256(canonical(body))}, sort_keys=True).encode()


def _collect(store: Store, avatar: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The avatar record and its stage records; raises NotHotError when any is missing."""
    with store.read() as r:
        record = r.get("avatar", avatar)
        if record is None:
            raise NotHotError(
                f"avatar {avatar[:16]} is not in the store at {store.path}; "
                f"precompile it before pushing"
            )
        stages = {}
        for name, key in record["stages"].items():
            rec = r.stage(key)
            if rec is None:
                raise NotHotError(
                    f"avatar {avatar[:16]} lacks its {name} stage in {store.path}; "
                    f"run `hotplate verify --repair` and push again"
                )
            stages[key] = {
                "name": rec.name,
                "blobs": rec.blobs,
                "meta": rec.meta,
                "created": rec.created,
                "nbytes": rec.nbytes,
            }
    record = {k: v for k, v in record.items() if k != "created"}
    return record, stages


def _blob(store: Store, digest: str) -> bytes:
    """A copy of one blob's bytes, checked against its xxh3 name and its codec checksum."""
    with store.read() as r:
        value = r.txn.get(digest.encode(), db=store.dbs["blob"])
        data = None if value is None else bytes(value)
    if data is None or xxhash.xxh3_128_hexdigest(data) != digest:
        raise NotHotError(
            f"blob {digest[:16]} in {store.path} is missing or damaged; "
            f"run `hotplate verify --repair` and push again"
        )
    try:
        codec.decode(data, verify=True)
    except codec.CodecError as exc:
        raise NotHotError(
            f"blob {digest[:16]} in {store.path} is damaged ({exc}); "
            f"run `hotplate verify --repair` and push again"
        ) from exc
    return data


def push_avatar(
    store: Store, remote: Remote, avatar: str, progress: Progress | None = None
) -> PushReport:
    """Upload one hot avatar; raises NotHotError (local data missing) and RemoteError."""
    start = time.perf_counter()
    progress = progress or (lambda done, total: None)
    record, stages = _collect(store, avatar)
    digests = sorted({d for s in stages.values() for d in s["blobs"].values()})
    report = PushReport(avatar, blobs=len(digests))
    sizes: dict[str, int] = {}
    with store.read() as r:  # sizes for progress, without copying anything yet
        for d in digests:
            value = r.txn.get(d.encode(), db=store.dbs["blob"])
            sizes[d] = 0 if value is None else len(value)
    total, done = sum(sizes.values()), 0
    names: dict[str, list] = {}
    lock = threading.Lock()

    def one(digest: str) -> None:
        nonlocal done
        data = _blob(store, digest)
        name = sha256(data)
        path = cas_path(name)
        sent = remote.head(path) != len(data)
        if sent:
            remote.put(path, data)
        with lock:
            names[digest] = [name, len(data)]
            done += len(data)
            if sent:
                report.sent += 1
                report.bytes_sent += len(data)
            progress(done, total)

    # 1. blobs, a few at a time (obstore and hashlib release the GIL)
    with ThreadPoolExecutor(PARALLEL) as pool:
        for future in [pool.submit(one, d) for d in digests]:
            future.result()
    # 2. the manifest, last: whoever finds it finds every blob it names
    body = {
        "hotplate": MANIFEST_VERSION,
        "avatar": avatar,
        "record": record,
        "stages": stages,
        "blobs": names,
    }
    remote.put(ac_path("avatar", avatar), manifest_bytes(body))
    report.seconds = time.perf_counter() - start
    if not store.readonly:
        store.count("pushes")
        store.count("bytes_pushed", report.bytes_sent)
    return report


_BACKGROUND: list[threading.Thread] = []


def push_in_background(
    store: Store, remote: Remote, avatar: str, say: Callable[[str], None] | None = None
) -> threading.Thread:
    """Push after a JIT build without holding up the render; a failure is a warning line
    and the `push_failures` counter, never an error. A process that ends waits for its
    pushes up to BACKGROUND_JOIN seconds (the client's timeouts bound each request)."""
    say = say or logger.warning

    def run() -> None:
        try:
            push_avatar(store, remote, avatar)
        except Exception as exc:  # a background thread must not die loudly mid-render
            why = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
            say(f"warning: push of avatar {avatar[:16]} to {remote.url} failed: {why}")
            with contextlib.suppress(Exception):  # the store may be closing
                store.count("push_failures")

    thread = threading.Thread(target=run, name=f"push-{avatar[:12]}", daemon=True)
    if not _BACKGROUND:
        atexit.register(wait_for_pushes)
    _BACKGROUND.append(thread)
    thread.start()
    return thread


def push_after_build(
    store: Store, avatar: str, say: Callable[[str], None] | None = None
) -> threading.Thread | None:
    """The precompile build hook: push `avatar` in the background when a remote is set."""
    from cachestore.remote.tier import remote_for

    try:
        remote = remote_for(store)
    except RemoteError as exc:
        (say or logger.warning)(f"warning: {exc}")
        return None
    if remote is None:
        return None
    thread = push_in_background(store, remote, avatar, say)
    from cachestore.remote import ray_flight

    ray_flight.held_push(store, avatar, thread)  # another node waits for this push, not less
    return thread


def wait_for_pushes(timeout: float = BACKGROUND_JOIN) -> bool:
    """Join this process's background pushes; False when one is still running."""
    deadline = time.monotonic() + timeout
    for thread in list(_BACKGROUND):
        thread.join(max(0.0, deadline - time.monotonic()))
    _BACKGROUND[:] = [t for t in _BACKGROUND if t.is_alive()]
    return not _BACKGROUND
