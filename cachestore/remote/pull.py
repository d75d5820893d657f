"""Pull an avatar from the blob tier into the local store: blobs first, manifests last.

1. GET the avatar's manifest (`ac/`), check its own SHA-256 and its shape;
2. GET each blob the store lacks (`cas/<sha256>`), a few at a time, and check it before
   it enters the store: its size, its SHA-256 (the remote's name), its xxh3-128 (the
   store's name) and the codec checksum inside it. Blobs are written in batches;
3. write every stage record and the avatar record in one write transaction, which first
   checks that every blob they name is present (gc may have taken an orphan meanwhile).

A damaged or truncated object is refused and named in one line; an unreachable or slow
remote gives one line naming it. Either way `pull_avatar` returns None and the caller
builds locally: the remote can cost a render a timeout, never its result. The blobs a
failed pull wrote, and no manifest names, are left to gc.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import xxhash

from cachestore import codec
from cachestore.errors import MissingStageError, StoreError
from cachestore.keys import canonical
from cachestore.remote.push import MANIFEST_VERSION, PARALLEL
from cachestore.remote.tier import (
    Remote,
    RemoteDamagedError,
    RemoteError,
    ac_path,
    cas_path,
    remote_for,
    sha256,
)
from cachestore.store import Store, pack

logger = logging.getLogger(__name__)

BATCH_BYTES = 64 << 20  # blobs per write transaction: bounds the memory a pull holds
DEADLINE = 300.0  # seconds for a whole pull: a trickling remote cannot hold a render longer

# progress(done_bytes, total_bytes)
Progress = Callable[[int, int], None]


@dataclass
class PullReport:
    avatar: str
    url: str
    blobs: int = 0  # blobs the avatar names
    fetched: int = 0  # blobs downloaded (the rest were in the store already)
    bytes: int = 0  # bytes downloaded
    seconds: float = 0.0

    def line(self) -> str:
        mb = self.bytes / 1e6
        return (
            f"pulled avatar {self.avatar[:16]} from {self.url} in {self.seconds:.2f} s "
            f"({self.fetched} of {self.blobs} blobs, {mb:.1f} MB)"
        )


def parse_manifest(data: bytes, avatar: str, where: str) -> dict[str, Any]:
    """The manifest's body; raises RemoteDamagedError unless it is whole and for `avatar`."""
    try:
        outer = json.loads(bytes(data))
        body = outer["body"]
        ok = outer["sha256"] == sha256(canonical(body))
        ok = ok and body["hotplate"] == MANIFEST_VERSION and body["avatar"] == avatar
        stages, blobs = body["stages"], body["blobs"]
        named = {d for s in stages.values() for d in s["blobs"].values()}
        ok = ok and set(body["record"]["stages"].values()) <= set(stages) and named <= set(blobs)
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise RemoteDamagedError(
            f"remote manifest {where} is damaged or truncated (checksum or fields); "
            f"refused, building locally (push again from a good store to mend it)"
        )
    return body


def check_blob(data: Any, digest: str, name: str, size: int, where: str) -> Any:
    """The blob's bytes when they are what the manifest names; else RemoteDamagedError."""
    if data is None:
        raise RemoteDamagedError(f"remote blob {where} is missing; refused, building locally")
    why = None
    if len(data) != size:
        why = f"{len(data)} bytes, the manifest says {size}: truncated"
    elif sha256(data) != name:
        why = "SHA-256 does not match its name"
    elif xxhash.xxh3_128_hexdigest(data) != digest:
        why = "xxh3 does not match the store digest"
    else:
        try:
            codec.decode(data, verify=True)
        except codec.CodecError as exc:
            why = f"not a whole blob ({exc})"
    if why is not None:
        raise RemoteDamagedError(
            f"remote blob {where} is damaged ({why}); refused, building locally"
        )
    return data


def pull_avatar(
    store: Store,
    remote: Remote,
    avatar: str,
    progress: Progress | None = None,
    deadline: float = DEADLINE,
) -> PullReport | None:
    """Bring avatar `avatar` from the tier into `store`; None when the tier lacks it.

    Raises RemoteDamagedError (a damaged object: nothing names what was written),
    RemoteError (unreachable, slow, past `deadline` seconds) and StoreError.
    """
    start = time.perf_counter()
    progress = progress or (lambda done, total: None)
    report = PullReport(avatar, remote.url)
    # 1. the manifest
    where = remote.where(ac_path("avatar", avatar))
    data = remote.get(ac_path("avatar", avatar))
    if data is None:
        return None
    body = parse_manifest(data, avatar, where)
    stages: dict[str, dict[str, Any]] = body["stages"]
    wanted = {d for s in stages.values() for d in s["blobs"].values()}
    report.blobs = len(wanted)
    with store.read() as r:  # what the store has whole already is not fetched again
        missing = sorted(d for d in wanted if not r.blob_ok(d))
    total = sum(int(body["blobs"][d][1]) for d in missing)

    # 2. the blobs, fetched and verified a few at a time, written here in batches of
    # about BATCH_BYTES while the next ones download
    def fetch(digest: str) -> tuple[str, Any]:
        if time.perf_counter() - start > deadline:
            raise RemoteError(
                f"remote {remote.url} too slow: pull of avatar {avatar[:16]} passed {deadline:.0f} s"
            )
        name, size = body["blobs"][digest]
        path = cas_path(name)
        return digest, check_blob(remote.get(path), digest, name, int(size), remote.where(path))

    batch: dict[str, Any] = {}
    pending = 0
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = [pool.submit(fetch, d) for d in missing]
        try:
            for future in as_completed(futures):
                digest, blob = future.result()
                batch[digest] = blob
                pending += len(blob)
                report.fetched += 1
                report.bytes += len(blob)
                progress(report.bytes, total)
                if pending >= BATCH_BYTES:
                    _put_blobs(store, batch)
                    batch, pending = {}, 0
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    _put_blobs(store, batch)
    # 3. the manifests, in one transaction
    _put_manifests(store, avatar, body["record"], stages, report.bytes)
    report.seconds = time.perf_counter() - start
    return report


def _put_blobs(store: Store, blobs: dict[str, bytes]) -> None:
    if not blobs:
        return
    nbytes = sum(len(v) for v in blobs.values())

    def txn_fn(txn: Any) -> None:
        for digest, value in blobs.items():
            txn.put(digest.encode(), value, db=store.dbs["blob"])

    store.write(txn_fn, nbytes)


def _put_manifests(
    store: Store, avatar: str, record: dict[str, Any], stages: dict[str, dict], nbytes: int
) -> None:
    now = time.time()

    def txn_fn(txn: Any) -> None:
        blob_db, stage_db = store.dbs["blob"], store.dbs["stage"]
        for key, stage in stages.items():
            for digest in stage["blobs"].values():
                if txn.get(digest.encode(), db=blob_db) is None:
                    raise MissingStageError(
                        f"blob {digest[:16]} vanished (gc) before avatar {avatar[:16]} was pulled"
                    )
            txn.put(key.encode(), pack(stage), db=stage_db)
        txn.put(avatar.encode(), pack({**record, "created": now}), db=store.dbs["avatar"])
        txn.put(avatar.encode(), pack(now), db=store.dbs["access"])
        store._count(txn, "pulls", 1)
        store._count(txn, "bytes_pulled", nbytes)
        store._count(txn, "remote_hits", 1)

    store.write(txn_fn)


def pull_on_miss(
    store: Store,
    avatar: str,
    say: Callable[[str], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    wait: float | None = None,
) -> PullReport | None:
    """The precompile miss hook: pull `avatar` when a remote is set and has it; in a Ray
    cluster, wait at most `wait` seconds (the caller's flight_wait) for another node's
    build of it.

    Never raises for the remote's sake: a damaged object, an unreachable or slow remote
    is one line to `say`, and None (build locally). Counts remote hits and misses.
    """
    say = say or logger.warning
    try:
        remote = remote_for(store)
    except RemoteError as exc:
        say(f"warning: {exc}")
        return None
    if remote is None or store.readonly:
        return None
    step = progress or (lambda stage, done, total: None)

    def pull() -> PullReport | None:
        return pull_avatar(store, remote, avatar, lambda done, total: step("pull", done, total))

    try:
        # in a Ray cluster, one node builds and the others wait, then pull (ray_flight.py)
        report = _cluster_pull(store, avatar, pull, say, wait)
    except RemoteDamagedError as exc:
        store.count("remote_damaged")
        say(f"warning: {exc}")
        return None
    except (RemoteError, MissingStageError) as exc:
        say(f"warning: {exc}; building locally")
        return None
    except StoreError:
        raise  # the local store's own trouble (full disk) is the render's to report
    if report is None:
        store.count("remote_misses")
        return None
    say(report.line())
    return report


def _cluster_pull(
    store: Store,
    avatar: str,
    pull: Callable[[], Any],
    say: Callable[[str], None],
    wait: float | None = None,
):
    from cachestore.remote import ray_flight

    if not os.environ.get(ray_flight.ADDRESS_ENV):
        return pull()
    try:
        claim = ray_flight.lease(store, avatar)
    except Exception as exc:  # no cluster after all: this node's flock still holds
        say(f"warning: no cluster-wide single flight ({type(exc).__name__}: {exc}); pulling alone")
        return pull()
    if claim is None:
        return pull()
    return ray_flight.before_pull(
        store, avatar, pull, say, ray_flight.WAIT if wait is None else wait
    )
