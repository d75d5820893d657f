"""Pull an avatar from the blob tier into the local store: blobs first, manifests last.

1. GET the avatar's manifest (`ac/`) and check every field of it (manifest.py): its own
   SHA-256, its signature when `remote_key` is set, and that it names exactly the stage
   keys the puller planned itself; then each stage's card (its meta, as an object of its
   own), which must hold the meta the manifest says;
2. GET each blob the store lacks (`cas/<sha256>`), a few at a time, and check it before
   it enters the store: its size, its SHA-256 (the remote's name), its xxh3-128 (the
   store's name) and its header. Blobs are written in batches of about BATCH_BYTES, and
   no more is downloaded while a batch waits: the bytes a pull holds are bounded;
3. check what the arrays decode to against the records (a bank's rows are its
   entries), then write the records in one write transaction: only this avatar's, under
   the planned keys, and never over a record the store has already. The blobs it wrote
   are leased until then (gc keeps leased blobs), so none can vanish before a record
   names it.

A damaged, truncated or unsigned object is refused and named in one line; an
unreachable or slow remote gives one line naming it. Either way the caller builds
locally: the remote can cost a render a timeout, never its result. The blobs a failed
pull wrote, and no manifest names, are left to gc; a blob refused as damaged is noted
(`meta` key `remote_mend`), so that the push after the local build uploads it again even
where the tier holds an object of its name and size.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import xxhash

from cachestore import codec
from cachestore.errors import MissingStageError, StoreError
from cachestore.leases import Lease
from cachestore.remote.manifest import check_card, parse_manifest
from cachestore.remote.push import PARALLEL, note_mend
from cachestore.remote.tier import (
    Remote,
    RemoteDamagedError,
    RemoteError,
    ac_path,
    cas_path,
    remote_for,
    remote_key,
    sha256,
)
from cachestore.store import Store, pack

logger = logging.getLogger(__name__)

BATCH_BYTES = 64 << 20  # blobs per write transaction; with what is in flight, what a pull holds
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


def check_blob(data: Any, digest: str, name: str, size: int, where: str) -> Any:
    """The blob's bytes when they are what the manifest names; else RemoteDamagedError
    (its `path` is the object's, `cas/<name>`)."""
    path = cas_path(name)
    if data is None:
        raise RemoteDamagedError(
            f"remote blob {where} is missing; refused, building locally", path=path
        )
    why = None
    if len(data) != size:
        why = f"{len(data)} bytes, the manifest says {size}: truncated"
    elif sha256(data) != name:
        why = "SHA-256 does not match its name"
    elif xxhash.xxh3_128_hexdigest(data) != digest:
        why = "xxh3 does not match the store digest"
    else:
        try:
            codec.read_header(data)  # the digest matched: the bytes are whole, is the header?
        except codec.CodecError as exc:
            why = f"not a hotplate array ({exc})"
    if why is not None:
        raise RemoteDamagedError(
            f"remote blob {where} is damaged ({why}); refused, building locally", path=path
        )
    return data


def pull_avatar(
    store: Store,
    remote: Remote,
    avatar: str,
    stages: Mapping[str, str],
    progress: Progress | None = None,
    deadline: float = DEADLINE,
) -> PullReport | None:
    """Bring avatar `avatar`, whose stages are `stages` (name -> key, from the caller's
    own plan), from the tier into `store`; None when the tier lacks it.

    Raises RemoteDamagedError (a damaged or unsigned object: nothing names what was
    written), RemoteError (unreachable, slow, past `deadline` seconds; an unreadable key
    file) and StoreError.
    """
    start = time.perf_counter()
    progress = progress or (lambda done, total: None)
    report = PullReport(avatar, remote.url)
    key = remote_key(store.path)
    # 1. the manifest
    where = remote.where(ac_path("avatar", avatar))
    data = remote.get(ac_path("avatar", avatar))
    if data is None:
        return None
    body = parse_manifest(data, avatar, stages, where, key)
    _check_cards(remote, body)
    blobs: dict[str, list] = body["blobs"]
    # leased before the store is looked at: gc keeps leased stages and blobs, and the
    # blobs written here are orphans until the records name them
    with _lease(store, [avatar, *stages.values(), *blobs]), ThreadPoolExecutor(PARALLEL) as pool:
        with store.read() as r:
            # a record the store has already is kept, so the blobs wanted are the ones the
            # records that will be in force name (and the tier holds)
            local = {k: r.get("stage", k) for k in stages.values()}
            named = {
                d
                for k in stages.values()
                for d in (local[k] or body["stages"][k])["blobs"].values()
                if d in blobs
            }
            missing = sorted(d for d in named if not r.blob_ok(d))
        report.blobs = len(named)
        total = sum(blobs[d][1] for d in missing)

        # 2. the blobs, verified as they arrive and written in batches
        def fetch(digest: str) -> tuple[str, Any]:
            if time.perf_counter() - start > deadline:
                raise RemoteError(
                    f"remote {remote.url} too slow: pull of avatar {avatar[:16]} passed "
                    f"{deadline:.0f} s"
                )
            name, size = blobs[digest]
            path = cas_path(name)
            return digest, check_blob(remote.get(path), digest, name, size, remote.where(path))

        batch: dict[str, Any] = {}
        held = 0  # bytes in the batch and on their way: at most BATCH_BYTES (or one blob)
        todo = list(reversed(missing))
        running: set[Future] = set()
        try:
            while todo or running:
                # back-pressure: a download starts only while what is held leaves room
                while todo and len(running) < PARALLEL:
                    size = blobs[todo[-1]][1]
                    if held and held + size > BATCH_BYTES:
                        break
                    held += size
                    running.add(pool.submit(fetch, todo.pop()))
                if not running:  # the next blob does not fit beside the batch: write it
                    held -= _flush(store, batch)
                    continue
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    digest, blob = future.result()
                    batch[digest] = blob
                    report.fetched += 1
                    report.bytes += len(blob)
                    progress(report.bytes, total)
                # half the budget: written while the other half downloads
                if sum(map(len, batch.values())) * 2 >= BATCH_BYTES or not (todo or running):
                    held -= _flush(store, batch)
        except BaseException:
            for future in running:
                future.cancel()
            raise
        # 3. the records, in one transaction, while the blobs are still leased: once the
        # arrays they name are what the records say (a bank's rows are its entries)
        _check_rows(store, body, stages, local, where)
        _put_records(store, body, stages, local, report.bytes)
    report.seconds = time.perf_counter() - start
    return report


def _check_cards(remote: Remote, body: dict[str, Any]) -> None:
    """Each stage's card (manifest.py): the manifest's meta of every stage must be what
    its card object holds; raises RemoteDamagedError (its `path` the card's) otherwise."""

    def one(stage_key: str) -> None:
        rec = body["stages"][stage_key]
        path = cas_path(rec["card"][0])
        try:
            check_card(remote.get(path), stage_key, rec, remote.where(path))
        except RemoteDamagedError as exc:
            raise RemoteDamagedError(str(exc), path=path) from None

    with ThreadPoolExecutor(PARALLEL) as pool:
        for future in [pool.submit(one, k) for k in sorted(body["stages"])]:
            future.result()


# a bank stage's arrays of one row per entry (pipeline/mouth/bank.py)
BANK_ROWS = ("shapes", "lips", "jaw", "frame_index")


def _check_rows(
    store: Store,
    body: dict[str, Any],
    stages: Mapping[str, str],
    local: dict[str, Any],
    where: str,
) -> None:
    """A bank stage about to be written holds as many rows as its meta's entries (what
    the blobs decode to, against what the manifest says); RemoteDamagedError otherwise."""
    key = stages.get("bank")
    if key is None or local[key] is not None:
        return
    rec = body["stages"][key]
    entries = rec["meta"].get("entries", 0)
    with store.read() as r:
        for name in BANK_ROWS:
            digest = rec["blobs"].get(name)
            if digest is None:
                continue
            value = r.txn.get(digest.encode(), db=store.dbs["blob"])
            rows = () if value is None else codec.read_header(value).shape
            if not rows or rows[0] != entries:
                raise RemoteDamagedError(
                    f"remote manifest {where} is damaged: its bank's {name} holds "
                    f"{rows[0] if rows else 0} rows, its meta says {entries} entries; refused, "
                    f"building locally (a push from a good store mends it)"
                )


def _lease(store: Store, keys: list[str]) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if store.readonly else Lease(store.path, keys)


def _flush(store: Store, batch: dict[str, Any]) -> int:
    """Write the batch's blobs in one transaction and empty it; returns the bytes written."""
    if not batch:
        return 0
    nbytes = sum(len(v) for v in batch.values())

    def txn_fn(txn: Any) -> None:
        for digest, value in batch.items():
            txn.put(digest.encode(), value, db=store.dbs["blob"])

    store.write(txn_fn, nbytes)
    batch.clear()
    return nbytes


def _put_records(
    store: Store,
    body: dict[str, Any],
    stages: Mapping[str, str],
    local: dict[str, Any],
    nbytes: int,
) -> None:
    """The stage records the store lacks and the avatar record, built from the checked
    manifest under the planned keys; none is written over one the store has."""
    now = time.time()
    blobs = body["blobs"]
    records = {}
    for name, key in stages.items():
        if local[key] is not None:
            continue
        rec = body["stages"][key]
        records[key] = {
            "name": name,
            "blobs": rec["blobs"],
            "sizes": {n: blobs[d][1] for n, d in rec["blobs"].items()},
            "meta": rec["meta"],
            "created": now,
            "nbytes": rec["nbytes"],
        }
    avatar = body["avatar"]

    def txn_fn(txn: Any) -> None:
        # every blob is here: written by this pull (leased since) or whole before it
        stage_db, avatar_db = store.dbs["stage"], store.dbs["avatar"]
        for key, rec in records.items():
            if txn.get(key.encode(), db=stage_db) is None:  # written meanwhile: theirs stays
                txn.put(key.encode(), pack(rec), db=stage_db)
        if txn.get(avatar.encode(), db=avatar_db) is None:
            txn.put(avatar.encode(), pack({**body["record"], "created": now}), db=avatar_db)
        txn.put(avatar.encode(), pack(now), db=store.dbs["access"])
        store._count(txn, "pulls", 1)
        store._count(txn, "bytes_pulled", nbytes)
        store._count(txn, "remote_hits", 1)

    store.write(txn_fn)


def pull_on_miss(
    store: Store,
    avatar: str,
    stages: Mapping[str, str],
    say: Callable[[str], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    wait: float | None = None,
) -> PullReport | None:
    """The precompile miss hook: pull `avatar` (its `stages` planned by the caller) when a
    remote is set and has it; in a Ray cluster, wait at most `wait` seconds (the caller's
    flight_wait) for another node's build of it.

    Never raises for the remote's sake: a damaged or unsigned object, an unreachable or
    slow remote, an error of the cluster's single flight (Ray), is one line to `say` and
    None (build locally). Only the local store's own trouble (a full disk) raises.
    Counts remote hits and misses.
    """
    say = say or logger.warning
    remote = remote_for(store, say)
    if remote is None:
        return None
    step = progress or (lambda stage, done, total: None)

    def pull() -> PullReport | None:
        return pull_avatar(
            store, remote, avatar, stages, lambda done, total: step("pull", done, total)
        )

    try:
        # in a Ray cluster, one node builds and the others wait, then pull (ray_flight.py)
        report = _cluster_pull(store, avatar, pull, say, wait)
    except RemoteDamagedError as exc:
        store.count("remote_damaged")
        if exc.path is not None:
            note_mend(store, exc.path)  # the push after the local build uploads it again
        say(f"warning: {exc}")
        return None
    except (RemoteError, MissingStageError) as exc:
        say(f"warning: {exc}; building locally")
        return None
    except StoreError:
        raise  # the local store's own trouble (full disk) is the render's to report
    except Exception as exc:  # the cluster's flight (Ray), or a client's surprise
        reason = (str(exc).splitlines() or [""])[0][:200]  # Ray's messages span lines
        say(
            f"warning: pull of avatar {avatar[:16]} failed ({type(exc).__name__}: {reason}); "
            f"building locally"
        )
        return None
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
