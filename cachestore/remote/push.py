"""Push a hot avatar to the blob tier: blobs first, then its manifest, under a lease.

Each blob is checked against its digest before it leaves (a damaged local blob is not
spread), named by its SHA-256, and skipped when the tier already holds an object of that
name and size (one HEAD each), unless this store once refused that object as damaged
(`remote_mend`): then it is uploaded again, which mends it. The manifest goes last (signed
when `remote_key` is set, manifest.py), so a reader that finds it finds every blob it
names. Two stores pushing the same avatar at once write the same blob bytes under the
same names; each PUT is atomic, so the later one wins whole. The avatar is leased for
the whole push, so gc cannot take it midway.

After a build, the push runs in a process of its own (`push_after_build`, this module's
`main`), not in a thread of the builder: a render worker is killed when its job is
cancelled and shortly after the server stops, and a push in its thread died with it. The
push process leases the avatar before the builder lets go of its own lease, gives up
after PUSH_SECONDS, and writes the store's push counters itself; a process that ends
waits for its pushes up to that long.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cachestore import codec
from cachestore.errors import StoreError, StoreFullError
from cachestore.leases import Lease
from cachestore.remote.manifest import MANIFEST_VERSION, card_bytes, manifest_bytes
from cachestore.remote.tier import (
    Remote,
    ac_path,
    cas_path,
    open_remote,
    remote_key,
    sha256,
)
from cachestore.store import Store, pack, unpack

logger = logging.getLogger(__name__)

PARALLEL = 4  # objects in flight at once; loopback and LAN tiers saturate at a few
PUSH_SECONDS = 60.0  # a push process gives up after this long; an ending process waits as long
MEND = "remote_mend"  # meta key: object paths this store refused as damaged on the tier

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
    names: dict[str, list] = field(default_factory=dict)  # xxh3 -> [sha256, size]
    mended: set[str] = field(default_factory=set)  # refused objects uploaded again


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
    """A copy of one blob's bytes, checked whole against its digest."""
    with store.read() as r:
        value = r.txn.get(digest.encode(), db=store.dbs["blob"])
        data = None if value is None else bytes(value)
    try:
        if data is None:
            raise codec.CodecError("missing")
        codec.check(data, digest)
    except codec.CodecError as exc:
        raise NotHotError(
            f"blob {digest[:16]} in {store.path} is missing or damaged ({exc}); "
            f"run `hotplate verify --repair` and push again"
        ) from exc
    return data


def note_mend(store: Store, path: str) -> None:
    """Remember that the tier's object `path` was refused as damaged: the next push of a
    blob of that name uploads it whatever HEAD says. Skipped on a full disk."""
    _change_mend(store, lambda found: found | {path})


def _change_mend(store: Store, change: Callable[[set[str]], set[str]]) -> None:
    def txn_fn(txn: Any) -> None:
        db = store.dbs["meta"]
        found = set(unpack(txn.get(MEND.encode(), db=db)) or [])
        txn.put(MEND.encode(), pack(sorted(change(found))), db=db)

    with contextlib.suppress(StoreFullError):
        store.write(txn_fn)


def push_avatar(
    store: Store,
    remote: Remote,
    avatar: str,
    progress: Progress | None = None,
    on_leased: Callable[[], None] | None = None,
) -> PushReport:
    """Upload one hot avatar under a lease (on_leased() is called once it is held);
    raises NotHotError (local data missing) and RemoteError (the tier, or an unreadable
    remote_key file: nothing unsigned is pushed when a key is set)."""
    start = time.perf_counter()
    progress = progress or (lambda done, total: None)
    key = remote_key(store.path)
    with contextlib.ExitStack() as held:
        if not store.readonly:  # a read-only store has no gc that could take it
            held.enter_context(Lease(store.path, [avatar]))
        if on_leased is not None:
            on_leased()
        record, stages = _collect(store, avatar)
        report = _push_blobs(store, remote, avatar, stages, progress)
        _push_cards(store, remote, stages)
        # the manifest, last: whoever finds it finds every blob it names
        body = {
            "hotplate": MANIFEST_VERSION,
            "avatar": avatar,
            "record": record,
            "stages": stages,
            "blobs": report.names,
        }
        remote.put(ac_path("avatar", avatar), manifest_bytes(body, key))
    report.seconds = time.perf_counter() - start
    if not store.readonly:
        store.count("pushes")
        store.count("bytes_pushed", report.bytes_sent)
        if report.mended:
            _change_mend(store, lambda found: found - report.mended)
    return report


def _push_cards(store: Store, remote: Remote, stages: dict[str, dict]) -> None:
    """Each stage's meta as an object of its own (manifest.py, `card_bytes`), named in its
    stage record: what binds the meta to content on the tier."""
    mend = set(store.read_value("meta", MEND) or [])

    def one(key: str) -> None:
        data = card_bytes(key, stages[key]["meta"])
        path = cas_path(sha256(data))
        if path in mend or remote.head(path) != len(data):
            remote.put(path, data)
        stages[key]["card"] = [path[4:], len(data)]

    with ThreadPoolExecutor(PARALLEL) as pool:
        for future in [pool.submit(one, k) for k in sorted(stages)]:
            future.result()


def _push_blobs(
    store: Store, remote: Remote, avatar: str, stages: dict[str, dict], progress: Progress
) -> PushReport:
    digests = sorted({d for s in stages.values() for d in s["blobs"].values()})
    report = PushReport(avatar, blobs=len(digests))
    mend = set(store.read_value("meta", MEND) or [])
    sizes: dict[str, int] = {}
    with store.read() as r:  # sizes for progress, without copying anything yet
        for d in digests:
            value = r.txn.get(d.encode(), db=store.dbs["blob"])
            sizes[d] = 0 if value is None else len(value)
    total, done = sum(sizes.values()), 0
    lock = threading.Lock()

    def one(digest: str) -> None:
        nonlocal done
        data = _blob(store, digest)
        path = cas_path(sha256(data))
        sent = path in mend or remote.head(path) != len(data)
        if sent:
            remote.put(path, data)
        with lock:
            report.names[digest] = [path[4:], len(data)]
            done += len(data)
            if sent:
                report.sent += 1
                report.bytes_sent += len(data)
                if path in mend:
                    report.mended.add(path)
            progress(done, total)

    # a few at a time (obstore and hashlib release the GIL)
    with ThreadPoolExecutor(PARALLEL) as pool:
        for future in [pool.submit(one, d) for d in digests]:
            future.result()
    return report


class Push:
    """A push process started after a build (see the module's docstring): its lines go to
    `say`; the builder's hand-over lease is released once the push has leased the avatar."""

    def __init__(self, proc: subprocess.Popen, lease: Lease, say: Callable[[str], None]) -> None:
        self.proc, self.lease, self.say = proc, lease, say
        self.thread = threading.Thread(target=self._follow, name="push-follow", daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        try:
            for line in self.proc.stdout:
                line = line.rstrip("\n")
                if line == "leased":
                    self.lease.release()  # the push holds its own now
                elif line:
                    self.say(line)
        finally:
            self.lease.release()
            self.proc.wait()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)


_BACKGROUND: list[Push] = []


def push_after_build(
    store: Store, avatar: str, say: Callable[[str], None] | None = None
) -> Push | None:
    """The precompile build hook: push `avatar` in a process of its own when a remote is
    set. Called while the build still leases the avatar; a hand-over lease covers the
    moment until the push process has taken its own. A failed push is a warning line and
    the `push_failures` counter, never an error."""
    from cachestore.remote import ray_flight
    from cachestore.remote.tier import remote_for

    say = say or logger.warning
    remote = remote_for(store, say)
    if remote is None:
        return None
    lease = Lease(store.path, [avatar])
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cachestore.remote.push", str(store.path), avatar, remote.url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # not the builder's: a Ctrl-C or a worker's kill spares it
        )
    except OSError as exc:
        lease.release()
        say(f"warning: push of avatar {avatar[:16]} to {remote.url} not started: {exc}")
        store.count("push_failures")
        return None
    push = Push(proc, lease, say)
    if not _BACKGROUND:
        atexit.register(wait_for_pushes)
    _BACKGROUND.append(push)
    ray_flight.held_push(store, avatar, push)  # another node waits for this push, not less
    return push


def wait_for_pushes(timeout: float = PUSH_SECONDS + 5) -> bool:
    """Join this process's pushes; False when one is still running."""
    deadline = time.monotonic() + timeout
    for push in list(_BACKGROUND):
        push.join(max(0.0, deadline - time.monotonic()))
    _BACKGROUND[:] = [p for p in _BACKGROUND if p.is_alive()]
    return not _BACKGROUND


def _tell(line: str) -> None:
    """A line to the builder, if it is still there to read it."""
    with contextlib.suppress(OSError):
        print(line, flush=True)


def main(argv: list[str]) -> int:
    """`python -m cachestore.remote.push CACHE AVATAR URL`: one push, as push_after_build
    starts it. Prints "leased" once the avatar is leased, then warnings, if any."""
    from cachestore.store import open_store

    cache, avatar, url = argv
    try:
        store = open_store(cache)
    except Exception as exc:  # the store went away (a test's tmp dir) or is full
        _tell(f"warning: push of avatar {avatar[:16]} to {url} failed: {exc}")
        return 1

    def give_up() -> None:
        _tell(f"warning: push of avatar {avatar[:16]} to {url} gave up after {PUSH_SECONDS:.0f} s")
        with contextlib.suppress(Exception):
            store.count("push_failures")
        os._exit(3)

    timer = threading.Timer(PUSH_SECONDS, give_up)
    timer.daemon = True
    timer.start()
    try:
        push_avatar(store, open_remote(url), avatar, on_leased=lambda: _tell("leased"))
    except Exception as exc:
        why = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
        _tell(f"warning: push of avatar {avatar[:16]} to {url} failed: {why}")
        with contextlib.suppress(Exception):  # the store may be gone (a test's tmp dir)
            store.count("push_failures")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
