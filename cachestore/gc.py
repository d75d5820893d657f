"""Garbage collection: keep what is rooted, recent or pinned; delete the rest.

Roots come from the caller (the avatar keys of the files now in the personas folder
under the current recipe). The whole decision and every deletion happen in one
write transaction, so a concurrent writer sees the store before or after gc, never
between. A render reads in many transactions, so it leases its avatar
(`cachestore/leases.py`): live leases are roots that even `max_size` never evicts. A
build in progress leases its avatar key and every stage key it will write, from its
flight lock to its avatar manifest, so the stages it has written are roots too; a pull
leases the blobs it writes until the records that name them are in.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from cachestore.errors import StoreNotWritableError
from cachestore.leases import Lease, gc_barrier, leased_keys, live_leases
from cachestore.store import Store, pack, unpack

DAY = 24 * 3600.0


@dataclass
class GcPlan:
    avatars: list[str] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)
    freed: dict[str, int] = field(default_factory=dict)  # entry "db:key" -> bytes
    total_entries: int = 0
    total_bytes: int = 0

    @property
    def deleted(self) -> int:
        return len(self.avatars) + len(self.stages) + len(self.blobs)

    @property
    def reclaimed(self) -> int:
        return sum(self.freed.values())

    def lines(self) -> list[str]:
        """One line per entry deleted, with its bytes: what --dry-run prints."""
        return [f"{name}\t{size}" for name, size in sorted(self.freed.items())]


def collect(
    store: Store,
    roots: Iterable[str],
    grace: float = DAY,
    max_size: int | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> GcPlan:
    """Delete unrooted avatars and stages older than `grace` seconds, then unnamed blobs.

    With max_size, also evict least-recently-used unpinned, unleased avatars until the
    bytes of what remains fit. Avatars named by a live lease are always kept; leases of
    dead processes are removed. Returns the plan, which a dry run computes without
    applying. Raises StoreError subclasses from the store; refuses a read-only store.
    """
    if store.readonly and not dry_run:
        raise StoreNotWritableError(
            f"gc cannot write to the store at {store.path} (opened read-only); "
            f"run it as a user who can write there"
        )
    now = time.time() if now is None else now
    roots = set(roots)

    def plan_in(txn, leased: set[str]) -> GcPlan:
        return _plan(store, txn, roots, leased, grace, max_size, now)

    if dry_run:
        leased = {k for info in live_leases(store.path, clean=False) for k in info.keys}
        with store.read() as r:
            return plan_in(r.txn, leased)

    def apply(txn) -> GcPlan:
        plan = plan_in(txn, leased)
        for db, keys in (
            ("avatar", plan.avatars),
            ("access", plan.avatars),
            ("stage", plan.stages),
            ("blob", plan.blobs),
        ):
            for key in keys:
                txn.delete(key.encode(), db=store.dbs[db])
        record = {
            "time": now,
            "deleted": plan.deleted,
            "of": plan.total_entries,
            "reclaimed": plan.reclaimed,
            "of_bytes": plan.total_bytes,
        }
        txn.put(b"last_gc", pack(record), db=store.dbs["meta"])
        return plan

    # the barrier: a reader leasing after this listing looks only after the commit
    with gc_barrier(store.path):
        leased = leased_keys(store.path)
        return store.write(apply)


def _plan(
    store: Store,
    txn,
    roots: set[str],
    leased: set[str],
    grace: float,
    max_size: int | None,
    now: float,
) -> GcPlan:
    def table(db: str) -> dict[str, tuple[object, int]]:
        with txn.cursor(db=store.dbs[db]) as cur:
            return {bytes(k).decode(): (v, len(k) + len(v)) for k, v in cur}

    avatars = {k: (unpack(v), n) for k, (v, n) in table("avatar").items()}
    stages = {k: (unpack(v), n) for k, (v, n) in table("stage").items()}
    access = {k: unpack(v) for k, (v, _) in table("access").items()}
    pins = set(table("pin"))
    blob_sizes = _blob_sizes(store, txn, [rec for rec, _ in stages.values()])

    plan = GcPlan(total_entries=len(avatars) + len(stages) + len(blob_sizes))
    plan.total_bytes = (
        sum(n for _, n in avatars.values())
        + sum(n for _, n in stages.values())
        + sum(blob_sizes.values())
    )

    def recent(t: float) -> bool:
        return now - t < grace

    keep_avatars = {
        k
        for k, (rec, _) in avatars.items()
        if k in roots or k in pins or k in leased or recent(max(access.get(k, 0.0), rec["created"]))
    }
    if max_size is not None:
        keep_avatars = _evict_lru(
            keep_avatars, avatars, stages, blob_sizes, access, pins | leased, max_size
        )

    named_stages = {s for k in keep_avatars for s in avatars[k][0]["stages"].values()}
    # a build in progress leases the stage keys it writes: no avatar names them yet
    keep_stages = {
        k
        for k, (rec, _) in stages.items()
        if k in named_stages or k in leased or (max_size is None and recent(rec["created"]))
    }
    named_blobs = {d for k in keep_stages for d in stages[k][0]["blobs"].values()}

    plan.avatars = sorted(set(avatars) - keep_avatars)
    plan.stages = sorted(set(stages) - keep_stages)
    # a pull leases the blobs it writes until its records name them
    plan.blobs = sorted(set(blob_sizes) - named_blobs - leased)
    plan.freed = {f"avatar:{k}": avatars[k][1] for k in plan.avatars}
    plan.freed.update({f"stage:{k}": stages[k][1] for k in plan.stages})
    plan.freed.update({f"blob:{k}": blob_sizes[k] for k in plan.blobs})
    return plan


def _blob_sizes(store: Store, txn, records: list[dict]) -> dict[str, int]:
    """Every blob key -> its entry's bytes, without reading the blobs: a stage record keeps
    the size of each blob it names (`sizes`). gc holds the lease barrier meanwhile, so a
    walk over every value (which a write transaction copies) would hold every new lease
    in every process for a read of the whole store. Only blobs no record sizes (orphans,
    records written before sizes were kept) are read."""
    known = {}
    for rec in records:
        for name, size in (rec.get("sizes") or {}).items():
            if name in rec["blobs"]:
                known[rec["blobs"][name]] = size
    db = store.dbs["blob"]
    sizes = {}
    with txn.cursor(db=db) as cur:
        for k in cur.iternext(keys=True, values=False):
            digest = bytes(k).decode()
            size = known.get(digest)
            sizes[digest] = len(k) + (len(txn.get(k, db=db)) if size is None else size)
    return sizes


def _evict_lru(keep, avatars, stages, blob_sizes, access, pins, max_size) -> set[str]:
    """Drop least-recently-used avatars not in `pins` (pinned or leased) until the blobs
    they need fit max_size."""
    keep = set(keep)
    stage_refs = Counter(s for k in keep for s in avatars[k][0]["stages"].values())
    blob_refs = Counter(
        d for s in stage_refs for d in stages[s][0]["blobs"].values() if s in stages
    )
    size = (
        sum(blob_sizes.get(d, 0) for d in blob_refs)
        + sum(stages[s][1] for s in stage_refs if s in stages)
        + sum(avatars[k][1] for k in keep)  # the avatar manifests count toward the cap too
    )
    order = sorted(
        (k for k in keep if k not in pins), key=lambda k: access.get(k, avatars[k][0]["created"])
    )
    for key in order:
        if size <= max_size:
            break
        keep.discard(key)
        size -= avatars[key][1]
        for s in avatars[key][0]["stages"].values():
            stage_refs[s] -= 1
            if stage_refs[s] or s not in stages:
                continue
            size -= stages[s][1]
            for d in stages[s][0]["blobs"].values():
                blob_refs[d] -= 1
                if not blob_refs[d]:
                    size -= blob_sizes.get(d, 0)
    return keep


def discard_failed(store: Store, keys: Iterable[str], own: Lease | None) -> int:
    """Roll back the stage manifests a failed build wrote; returns how many went.

    A stage another live lease names is kept (a concurrent build of another recipe may
    share the decode or track stage it just read as a hit), and so is one an avatar
    names. The barrier is held from listing the leases to the commit, as gc holds it,
    so a build that leases a stage meanwhile either is seen or finds it gone and
    rebuilds it. The blobs they named are left to gc.
    """
    mine = {path for path, _ in own.files} if own is not None else set()
    with gc_barrier(store.path):
        others = {k for info in live_leases(store.path) if info.path not in mine for k in info.keys}

        def txn_fn(txn) -> int:
            named = set()
            with txn.cursor(db=store.dbs["avatar"]) as cur:
                for _, value in cur:
                    named.update(unpack(value)["stages"].values())
            gone = [k for k in keys if k not in named and k not in others]
            return sum(bool(txn.delete(k.encode(), db=store.dbs["stage"])) for k in gone)

        return store.write(txn_fn)
