"""The LMDB environment: named databases, atomic writes, map growth.

One environment per cache directory and per process (`open_store`). Values in `blob`
are codec arrays keyed by their content digest; every other database holds small
msgpack records. A stage's blobs and its manifest are written in one write
transaction, so a crash leaves all of it or none; a manifest whose blobs are missing
or damaged reads as a miss.

Guarantees: process-safe (LMDB's lock file), thread-safe for reads and writes, spawn-
safe, and fork-safe: a forked child never touches the environment it inherited (using or
closing it would end the parent's reads in the shared reader table), so asking for that
store there is one clear error; stores the parent never opened are the child's own. Not
for NFS.

Map growth: LMDB allows `set_mapsize` only while no transaction of this process is open,
and a resize unmaps every buffer handed out before it. So every transaction passes a
readers-writer gate (`TxnGate`): growing the map (on MapFullError) and adopting another
process's growth (on MapResizedError) wait until this process's open transactions have
ended, and hold new ones back meanwhile. Arrays handed out of a transaction are copies.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np

from cachestore import codec
from cachestore.errors import (
    MissingStageError,
    StoreDamagedError,
    StoreForkedError,
    StoreFullError,
    StoreNotWritableError,
)
from cachestore.keys import digest_bytes
from cachestore.space import free_bytes, full_error, is_full

SCHEMA = 1
DATABASES = ("blob", "stage", "avatar", "source", "access", "meta", "hashcache", "pin")
DEFAULT_MAP_SIZE = 8 << 30  # virtual; the file grows only as data is written (`map_size`)
MAX_READERS = 512
# What LMDB raises when the file's pages are not what its meta pages promise.
DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.IncompatibleError)


def pack(record: Any) -> bytes:
    return msgpack.packb(record, use_bin_type=True)


def unpack(value: bytes | memoryview | None) -> Any:
    return None if value is None else msgpack.unpackb(bytes(value), raw=False)


@dataclass
class StageRecord:
    """A stage manifest: which blobs hold the stage's arrays, and how it was made."""

    key: str
    name: str
    blobs: dict[str, str]  # array name -> blob digest
    meta: dict[str, Any]
    created: float
    nbytes: int


class Reader:
    """A read transaction. Arrays it returns are views valid only inside it."""

    def __init__(self, store: Store, txn: lmdb.Transaction) -> None:
        self.store, self.txn = store, txn

    def get(self, db: str, key: str) -> Any:
        return unpack(self.txn.get(key.encode(), db=self.store.dbs[db]))

    def items(self, db: str) -> Iterator[tuple[str, Any]]:
        with self.txn.cursor(db=self.store.dbs[db]) as cur:
            for k, v in cur:
                yield bytes(k).decode(), unpack(v)

    def stage(self, key: str) -> StageRecord | None:
        """The stage manifest, or None when it or any blob it names is missing."""
        rec = self.get("stage", key)
        if rec is None:
            return None
        blob_db = self.store.dbs["blob"]
        if any(self.txn.get(d.encode(), db=blob_db) is None for d in rec["blobs"].values()):
            return None
        return StageRecord(
            key, rec["name"], rec["blobs"], rec["meta"], rec["created"], rec["nbytes"]
        )

    def blob_ok(self, digest: str, checksums: bool = True, trust_unmoved: bool = False) -> bool:
        """The blob is present and whole: its header parses, its payload has the size the
        header gives and (with `checksums`) the whole value hashes to its digest.

        With `trust_unmoved` (the hit path's), a blob this process hashed whole before
        and that still lies at the same place in the same map is not hashed again:
        LMDB never writes a value in place (a rewrite, a delete and re-put, a repair all
        copy it to other pages), so an unmoved value is the value that was hashed. Its
        header is still checked, and every frame read hashes its blob anyway
        (docs/notebook/hot-path.md, "The hit check remembers what it hashed")."""
        value = self.txn.get(digest.encode(), db=self.store.dbs["blob"])
        if value is None:
            return False
        spot = self.store._spot(value) if checksums and trust_unmoved else None
        remembered = spot is not None and self.store._hashed.get(digest) == spot
        try:
            codec.check(value, digest if checksums and not remembered else None)
        except codec.CodecError:
            self.store._hashed.pop(digest, None)
            return False
        if spot is not None and not remembered:
            self.store._hashed[digest] = spot
        return True

    def stage_ok(self, key: str, checksums: bool = True) -> bool:
        """The stage manifest exists and every blob it names is whole (see blob_ok)."""
        return not self.damaged({"": key}, checksums)[0]

    def damaged(
        self, stages: Mapping[str, str], checksums: bool = True, trust_unmoved: bool = False
    ) -> tuple[list[str], list[str]]:
        """(the names of `stages`, name -> stage key, whose manifest is missing or names a
        missing or damaged blob; the digests of the present but damaged blobs).
        `trust_unmoved`: see blob_ok."""
        names, bad = [], []
        for name, key in stages.items():
            rec = self.get("stage", key)
            if rec is None:
                names.append(name)
                continue
            broken = [
                d for d in rec["blobs"].values() if not self.blob_ok(d, checksums, trust_unmoved)
            ]
            if broken:
                names.append(name)
                blob_db = self.store.dbs["blob"]
                bad += [d for d in broken if self.txn.get(d.encode(), db=blob_db) is not None]
        return names, bad

    def array(self, digest: str, verify: bool = True) -> np.ndarray:
        """Zero-copy view of one blob; raises KeyError if absent, CodecError if damaged
        (with `verify`, any byte of it: the value must hash to its digest)."""
        value = self.txn.get(digest.encode(), db=self.store.dbs["blob"])
        if value is None:
            raise KeyError(f"blob {digest} is not in the store")
        try:
            return codec.decode(value, verify=verify, digest=digest)[1]
        except codec.CodecError:
            # damage the hit check trusted (a remembered spot: freed pages are reused, so a
            # flipped copy can land where the whole value lay; or bytes changed under
            # LMDB): forget it, so the next hit check hashes it, calls it damaged and
            # removes it, and the avatar is rebuilt
            self.store._hashed.pop(digest, None)
            raise


class TxnGate:
    """A readers-writer gate around one process's LMDB transactions.

    Any number of threads hold it shared while a transaction is open; `exclusive(fn)`
    runs fn (a map resize) once none is open, and from its call on holds back threads
    that would open their first one, so a steady stream of readers cannot starve it.
    A thread already inside a transaction may open another (nested reads) without
    waiting, so the gate cannot deadlock a thread on itself.

    The shared side takes no lock: each thread counts its own open transactions, and
    a reader raises its count before it looks at the resize flag while the resizer
    raises the flag before it looks at the counts (Dekker's order; the GIL makes each
    step atomic and visible), so one of them always sees the other.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._resizing = False
        self._local = threading.local()
        self._counts: weakref.WeakSet[_Count] = weakref.WeakSet()  # dies with its thread

    def _count(self) -> _Count:
        count = getattr(self._local, "count", None)
        if count is None:
            count = self._local.count = _Count()
            with self._cond:
                self._counts.add(count)
        return count

    def enter(self) -> None:
        count = self._count()
        while True:
            count.n += 1
            if count.n > 1 or not self._resizing:
                return
            count.n -= 1  # a resize is under way: step back and wait for its end
            with self._cond:
                self._cond.notify_all()
                while self._resizing:
                    self._cond.wait()

    def leave(self) -> None:
        count = self._local.count
        count.n -= 1
        if count.n == 0 and self._resizing:
            with self._cond:
                self._cond.notify_all()

    def inside(self) -> bool:
        """True when this thread has a transaction open."""
        count = getattr(self._local, "count", None)
        return count is not None and count.n > 0

    def exclusive(self, fn: Any) -> Any:
        """Run fn() while no transaction of this process is open; returns its result.

        Raises RuntimeError when called by a thread that has one open itself (it would
        wait for itself)."""
        if self.inside():
            raise RuntimeError("the LMDB map cannot be resized inside a transaction")
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
        try:
            with self._cond:
                while any(c.n for c in list(self._counts)):
                    self._cond.wait(0.05)  # leave() notifies; the timeout is a safety net
            return fn()
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class _Count:
    __slots__ = ("n", "__weakref__")

    def __init__(self) -> None:
        self.n = 0


class Store:
    """One hotplate LMDB environment. Use `open_store` rather than this constructor."""

    def __init__(
        self, path: str | os.PathLike, map_size: int = DEFAULT_MAP_SIZE, readonly: bool = False
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.pid = os.getpid()  # the one process that may use (or close) the environment
        self._write_lock = threading.Lock()
        self._gate = TxnGate()
        # blobs the hit check hashed whole: digest -> where the value lay (Reader.blob_ok)
        self._hashed: dict[str, tuple[int, int, int]] = {}
        self._map_epoch = 0  # bumped at every remap: an address is only good in its map
        self._check_path()
        # LMDB's lock file needs write access; a store this user can only read is opened
        # without it (docs/notebook/store.md, "Read-only store": then no writer may run
        # while it is read)
        self.locked = not readonly or os.access(self.path, os.W_OK)
        self._hold = self._take_shared_hold()
        try:
            self.env = lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=len(DATABASES) + 2,
                max_readers=MAX_READERS,
                readonly=readonly,
                subdir=True,
                lock=self.locked,
                create=not readonly,
            )
        except lmdb.InvalidError as exc:
            raise StoreDamagedError(
                f"{self.path / 'data.mdb'} is not a valid LMDB file ({exc}); move it aside "
                f"(it is not deleted for you) and run again to start an empty store"
            ) from exc
        except lmdb.Error as exc:
            raise StoreDamagedError(f"cannot open the store at {self.path}: {exc}") from exc
        if self.locked:
            self.env.reader_check()  # clear reader slots left by crashed processes
        try:
            self.dbs = {name: self._open_db(name) for name in DATABASES}
            self._check_schema()
        except DAMAGE as exc:
            self.close()
            raise self._damaged(exc) from exc
        except StoreDamagedError:  # from the schema check: release the env and the hold
            self.close()
            raise

    # -- opening -------------------------------------------------------------

    def _check_path(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise StoreDamagedError(
                f"{self.path} is a file, not a store directory; move it aside or point --cache elsewhere"
            )
        data = self.path / "data.mdb"
        if data.exists() and 0 < data.stat().st_size < 2 * 4096:
            raise StoreDamagedError(
                f"{data} is truncated ({data.stat().st_size} bytes); move it aside and run again"
            )
        if self.readonly:
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StoreNotWritableError(
                f"cache directory {self.path} is not writable ({exc.strerror}); "
                f"fix its permissions or choose another with --cache or HOTPLATE_CACHE"
            ) from exc

    def _damaged(self, exc: Exception) -> StoreDamagedError:
        return StoreDamagedError(
            f"{self.path / 'data.mdb'} is damaged ({exc}); move it aside (it is not deleted "
            f"for you) and run again to start an empty store"
        )

    def _take_shared_hold(self) -> int | None:
        """A shared flock held while open, so `compact` can tell nobody else is using it."""
        if self.readonly and not (self.path / "hold.lock").exists():
            return None
        flags = os.O_RDONLY if self.readonly else os.O_RDWR | os.O_CREAT
        fd = os.open(self.path / "hold.lock", flags, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def _open_db(self, name: str) -> Any:
        if self.readonly:
            return self.env.open_db(name.encode(), create=False)
        return self.env.open_db(name.encode())

    def _check_schema(self) -> None:
        found = self.read_value("meta", "schema")
        if found is None and not self.readonly:
            self.write(lambda txn: txn.put(b"schema", pack(SCHEMA), db=self.dbs["meta"]))
        elif found not in (None, SCHEMA):
            raise StoreDamagedError(
                f"{self.path} holds store schema {found}, this hotplate reads {SCHEMA}; "
                f"point --cache at a new directory or run the hotplate that wrote it"
            )

    def close(self) -> None:
        """Close the environment; in a forked child only this copy of the hold is let go:
        closing the environment there would abort the parent's transactions."""
        if os.getpid() == self.pid:
            self.env.close()
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None

    # -- transactions ----------------------------------------------------------

    def _begin(self, write: bool) -> lmdb.Transaction:
        """Open a transaction with the gate held shared; adopts another process's map
        growth on the way (MapResizedError), with no transaction of ours open."""
        if os.getpid() != self.pid:
            raise forked_error(self.path, self.pid)
        while True:
            self._gate.enter()
            try:
                return self.env.begin(write=write, buffers=not write)
            except lmdb.MapResizedError:
                self._gate.leave()
                self._gate.exclusive(lambda: self._remap(0))
            except BaseException:
                self._gate.leave()
                raise

    @contextmanager
    def read(self) -> Iterator[Reader]:
        """A consistent snapshot; picks up a map grown by another process.

        Arrays from the Reader are views into the map, valid only inside the `with`."""
        txn = self._begin(write=False)
        try:
            yield Reader(self, txn)
        except (*DAMAGE, lmdb.BadTxnError) as exc:  # a read txn goes bad only on a bad page
            raise self._damaged(exc) from exc
        finally:
            self._abort(txn)
            self._gate.leave()

    def _abort(self, txn: lmdb.Transaction) -> None:
        """End a transaction, unless this is a forked child unwinding one its parent opened
        (a `with store.read()` around the fork, left by sys.exit): aborting it there would
        mark the parent's slot in the shared reader table free, and writers would reuse the
        pages under the parent's views. py-lmdb leaves such a transaction alone when it is
        freed in the child."""
        if os.getpid() == self.pid:
            txn.abort()

    def write(self, fn: Any, nbytes: int = 0) -> Any:
        """Run fn(txn) in one write transaction; grow the map and retry when it is full.

        fn must be repeatable: on MapFullError the transaction is aborted and fn runs again.
        nbytes: about how much the transaction writes, for the full-disk message.
        Raises StoreFullError when the disk is full (the transaction commits nothing).
        """
        with self._write_lock:
            while True:
                try:
                    return self._write_once(fn)
                except lmdb.MapFullError:
                    self._gate.exclusive(lambda: self._grow(nbytes))
                except lmdb.MapResizedError:
                    self._gate.exclusive(lambda: self._remap(0))
                except DAMAGE as exc:
                    raise self._damaged(exc) from exc
                except lmdb.Error as exc:
                    # LMDB reports a short write (ENOSPC) at commit as EIO: ask the disk
                    if is_full(exc) or free_bytes(self.path) < max(nbytes, 1 << 20):
                        raise full_error(self.path, nbytes) from exc
                    raise

    def _write_once(self, fn: Any) -> Any:
        txn = self._begin(write=True)
        try:
            result = fn(txn)
            txn.commit()
            return result
        except BaseException:
            self._abort(txn)
            raise
        finally:
            self._gate.leave()

    def _grow(self, nbytes: int) -> None:
        """Double the map, but never past what the disk can hold: the map is a promise
        LMDB makes to writers, so a map larger than the disk is refused here, in one
        line naming the space, rather than failing later inside a commit. Runs inside
        the gate's `exclusive`: no transaction of this process is open."""
        size = self.env.info()["map_size"]
        data = (self.path / "data.mdb").stat().st_size
        room = data + free_bytes(self.path)
        if room <= size:
            raise full_error(self.path, nbytes or size // 8)
        self._remap(min(size * 2, room))

    def _remap(self, size: int) -> None:
        """set_mapsize (0: adopt another process's growth); the map may move, so every
        remembered blob position is forgotten. Runs inside the gate's `exclusive`."""
        self.env.set_mapsize(size)
        self._map_epoch += 1
        self._hashed.clear()

    def _spot(self, value: memoryview | bytes) -> tuple[int, int, int] | None:
        """Where a value read in a read transaction lies: (address in the map, length,
        map epoch); None for a copy (a write transaction hands out bytes)."""
        if not isinstance(value, memoryview):
            return None
        return (np.frombuffer(value, np.uint8).ctypes.data, len(value), self._map_epoch)

    def read_value(self, db: str, key: str) -> Any:
        with self.read() as r:
            return r.get(db, key)

    # -- stage and avatar manifests ------------------------------------------------

    def put_stage(
        self, key: str, name: str, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
    ) -> StageRecord:
        """Write a stage's arrays and its manifest atomically; returns the manifest."""
        encoded = {n: codec.encode(a) for n, a in arrays.items()}
        blobs = {n: digest_bytes(v) for n, v in encoded.items()}
        nbytes = sum(len(v) for v in encoded.values())
        created = time.time()
        record = {
            "name": name,
            "blobs": blobs,
            "sizes": {n: len(v) for n, v in encoded.items()},  # gc measures by these
            "meta": dict(meta),
            "created": created,
            "nbytes": nbytes,
        }

        def txn_fn(txn: lmdb.Transaction) -> None:
            blob_db = self.dbs["blob"]
            for n, value in encoded.items():
                # a blob already stored under this digest is kept unless it is damaged:
                # then these (the bytes the digest names) replace it, which is the repair
                if txn.get(blobs[n].encode(), db=blob_db) != value:
                    txn.put(blobs[n].encode(), value, db=blob_db)
            txn.put(key.encode(), pack(record), db=self.dbs["stage"])
            self._count(txn, "bytes_written", nbytes)

        self.write(txn_fn, nbytes)
        return StageRecord(key, name, blobs, dict(meta), created, nbytes)

    def get_stage(self, key: str) -> StageRecord | None:
        with self.read() as r:
            return r.stage(key)

    def stage_ok(self, key: str) -> bool:
        """True when the stage manifest exists and every blob it names passes its checksum."""
        with self.read() as r:
            return r.stage_ok(key)

    def damaged_stages(
        self,
        stages: Mapping[str, str],
        checksums: bool = True,
        remove_damaged: bool = False,
        trust_unmoved: bool = False,
    ) -> list[str]:
        """The names (of `stages`, name -> stage key) whose manifest is missing or that
        name a missing or damaged blob, in one read snapshot. This is the hit path's
        integrity check: with `checksums` every blob is hashed whole against its digest,
        without it only headers and sizes are read.

        With `remove_damaged` (the hit path's), a damaged blob found is removed from a
        writable store, so damage found once is damage to every later check, the
        presence checks of listings included; the rebuild that follows writes it anew.
        `trust_unmoved` (the hit path's): a blob hashed before in this process and not
        moved since is not hashed again (Reader.blob_ok)."""
        with self.read() as r:
            names, bad = r.damaged(stages, checksums, trust_unmoved)
        if bad and remove_damaged and not self.readonly:
            self.drop_damaged(bad)
        return names

    def drop_damaged(self, digests: list[str]) -> None:
        """Delete these blobs where they are still damaged (a repair may have rewritten
        one meanwhile); skipped on a full disk, where the next check finds them again."""

        def txn_fn(txn: lmdb.Transaction) -> None:
            db = self.dbs["blob"]
            for digest in digests:
                value = txn.get(digest.encode(), db=db)
                if value is None:
                    continue
                try:
                    codec.check(value, digest)
                except codec.CodecError:
                    txn.delete(digest.encode(), db=db)
                    self._count(txn, "damaged_blobs_removed", 1)

        try:
            self.write(txn_fn)
        except StoreFullError:
            pass

    def load_arrays(self, key: str, names: list[str] | None = None) -> dict[str, np.ndarray] | None:
        """Copies of a stage's arrays, checksums verified; None when missing or damaged."""
        with self.read() as r:
            rec = r.stage(key)
            if rec is None:
                return None
            try:
                return {
                    n: r.array(d).copy()
                    for n, d in rec.blobs.items()
                    if names is None or n in names
                }
            except (KeyError, codec.CodecError):
                return None

    def put_avatar(self, key: str, record: Mapping[str, Any]) -> None:
        """Write an avatar manifest; raises MissingStageError if a stage it names is gone."""
        record = {**record, "created": time.time()}

        def txn_fn(txn: lmdb.Transaction) -> None:
            for stage in record["stages"].values():
                if txn.get(stage.encode(), db=self.dbs["stage"]) is None:
                    raise MissingStageError(
                        f"stage {stage} vanished before avatar {key} was written"
                    )
            txn.put(key.encode(), pack(record), db=self.dbs["avatar"])
            txn.put(key.encode(), pack(time.time()), db=self.dbs["access"])

        self.write(txn_fn)

    def get_avatar(self, key: str) -> dict[str, Any] | None:
        """The avatar manifest, or None when it or any stage or blob below it is missing."""
        with self.read() as r:
            rec = r.get("avatar", key)
            if rec is None or any(r.stage(s) is None for s in rec["stages"].values()):
                return None
            return rec

    def avatar_bytes(self, key: str) -> int | None:
        """The bytes of every stage the avatar names, read in one snapshot; None unless it
        is hot by the hit check's definition (pipeline/hot.py) at the depth a listing can
        afford: every stage there and every blob present with a whole header and payload
        size, its bytes not hashed. A listing shows a gc'd avatar cold, never fails."""
        with self.read() as r:
            rec = r.get("avatar", key)
            if rec is None or r.damaged(rec["stages"], checksums=False)[0]:
                return None
            return sum(r.get("stage", s)["nbytes"] for s in rec["stages"].values())

    def touch(self, key: str) -> None:
        """Record a use of an avatar (for LRU eviction and the gc grace period).

        A hint, not data: on a full disk it is skipped, so hot renders go on."""
        try:
            self.write(lambda txn: txn.put(key.encode(), pack(time.time()), db=self.dbs["access"]))
        except StoreFullError:
            pass

    # -- small records -----------------------------------------------------------

    def put(self, db: str, key: str, record: Any) -> None:
        self.write(lambda txn: txn.put(key.encode(), pack(record), db=self.dbs[db]))

    def delete(self, db: str, key: str) -> bool:
        return self.write(lambda txn: txn.delete(key.encode(), db=self.dbs[db]))

    def items(self, db: str) -> list[tuple[str, Any]]:
        with self.read() as r:
            return list(r.items(db))

    def count(self, name: str, n: int = 1) -> None:
        """Add n to a counter in `meta` (hits, misses, ...); skipped on a full disk."""
        try:
            self.write(lambda txn: self._count(txn, name, n))
        except StoreFullError:
            pass

    def _count(self, txn: lmdb.Transaction, name: str, n: int) -> None:
        key = f"count:{name}".encode()
        old = unpack(txn.get(key, db=self.dbs["meta"])) or 0
        txn.put(key, pack(old + n), db=self.dbs["meta"])


_OPEN: dict[tuple[str, bool], tuple[int, Store]] = {}
_OPEN_LOCK = threading.Lock()
# Stores a forked child inherited, by path: never used nor closed there, only remembered,
# so that asking for one is a clear error (py-lmdb refuses a second open in any case).
_INHERITED: dict[str, Store] = {}


def forked_error(path: str | os.PathLike, parent: int) -> StoreForkedError:
    return StoreForkedError(
        f"the store at {path} was opened by process {parent} before it forked this one "
        f"(pid {os.getpid()}); LMDB forbids using or closing it after fork, which would end "
        f"the parent's reads: open it in a process started with spawn "
        f"(multiprocessing.get_context('spawn')) or a new program instead"
    )


def open_store(
    path: str | os.PathLike, readonly: bool = False, map_size: int | None = None
) -> Store:
    """The process's one Store for this directory (LMDB forbids opening an env twice).

    A read-only request gets the writable Store when this process has one; a writable
    request closes a read-only Store this process opened before. map_size: the initial
    map (the `map_size` setting; default 8 GiB), used when this process first opens it.

    A child created by fork must not use its parent's environment, nor close it: a store
    the parent had open raises StoreForkedError there (one line naming the fix); any
    other store opens as usual.
    """
    real = os.path.realpath(path)
    mine = os.getpid()
    with _OPEN_LOCK:
        for entry, (pid, inherited) in list(_OPEN.items()):
            if pid != mine:  # opened before a fork: the parent's, left alone
                del _OPEN[entry]
                _INHERITED[entry[0]] = inherited
        if real in _INHERITED:
            raise forked_error(real, _INHERITED[real].pid)
        # A writable handle serves reads too; a read-only one is replaced by a writable one.
        for ro in (False, True) if readonly else (False,):
            if (real, ro) in _OPEN:
                return _OPEN[(real, ro)][1]
        if (real, True) in _OPEN:
            _OPEN.pop((real, True))[1].close()
        store = Store(real, map_size=map_size or DEFAULT_MAP_SIZE, readonly=readonly)
        _OPEN[(real, readonly)] = (mine, store)
        return store


def forget_store(path: str | os.PathLike) -> None:
    """Close and forget this process's handles on a store (after compact, in tests)."""
    real = os.path.realpath(path)
    with _OPEN_LOCK:
        for ro in (False, True):
            pid, store = _OPEN.pop((real, ro), (None, None))
            if store is not None and pid == os.getpid():
                store.close()
