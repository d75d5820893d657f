"""The daemon's intake: changes -> settle -> hash -> hot already, or a job.

`on_change` applies one change to the settler, the job queue and the `source` rows;
what only the loop can do (reconcile now, stop) comes back as a `Verdict`. `ready` takes
a settled file: hash it (stat cache first), key it, and mark it hot or queue its job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachestore.hashcache import file_digest, remember
from cachestore.keys import FileChangedError
from cachestore.store import Store
from watcher.events import (
    CLOSED,
    CREATED,
    DELETED,
    DIR_CREATED,
    DIR_DELETED,
    DIR_MOVED,
    IGNORED,
    MODIFIED,
    MOVED,
    OVERFLOW,
    Change,
    judge,
)
from watcher.jobs import JobQueue
from watcher.keys import Keys
from watcher.outcomes import Outcomes
from watcher.reconcile import persona_sources, rel_of, source_at
from watcher.settle import Settler
from watcher.sources import (
    HOT,
    QUEUED,
    RUNNING,
    delete_rows,
    load_rows,
    new_row,
    put_rows,
    row_stat,
    same_file,
    stat_of,
)

RESCAN = "rescan"  # events were lost: reconcile the folder now
STOP = "stop"  # the personas folder is gone: nothing is watched any more


@dataclass(frozen=True)
class Verdict:
    """What the loop must do after a change (a named value, as watchfiles' outcomes)."""

    action: str  # RESCAN or STOP
    reason: str = ""


class Intake:
    """Changes and settled files in; rows, jobs and verdicts out."""

    def __init__(
        self,
        root: Path,
        store: Store,
        settler: Settler,
        jobs: JobQueue,
        keys: Keys,
        outcomes: Outcomes,
        log: Any,
    ) -> None:
        self.root, self.store, self.settler, self.jobs = root, store, settler, jobs
        self.keys, self.outcomes = keys, outcomes
        self.log = log

    def on_change(self, ch: Change) -> Verdict | None:
        kind = ch.kind
        if kind == IGNORED:
            self.log("ignore", ch.path, ch.reason)
        elif kind == OVERFLOW:
            return Verdict(RESCAN, "the kernel dropped file events (overflow); reconciling")
        elif kind in (CREATED, MODIFIED, CLOSED):
            if self.settler.note(ch.path, closed=kind == CLOSED):
                wait_for = (
                    "still" if kind == CLOSED or not self.settler.need_close else "closed and still"
                )
                self.log("settle", ch.path, f"{kind}; waiting until it is {wait_for}")
        elif kind == DELETED:
            self.gone(ch.path, "deleted")
        elif kind == MOVED:
            self._moved(ch.path, ch.dest)
        elif kind == DIR_CREATED:
            self._arrived_dir(ch.path, closed=False)
        elif kind == DIR_MOVED:
            if ch.path and not ch.dest:
                self._gone_under(ch.path, "moved out of the folder")
            elif ch.dest and not ch.path:
                self._arrived_dir(ch.dest, closed=True)
            # a rename inside the tree: watchdog reports each file's move after this
        elif kind == DIR_DELETED and not ch.path:
            return Verdict(
                STOP,
                f"the personas folder {self.root} was deleted or moved away; nothing is watched "
                f"any more, so the watcher stops (start it again once the folder is back)",
            )
        elif kind == DIR_DELETED:
            self._gone_under(ch.path, "deleted")
        return None

    def gone(self, rel: str, why: str) -> None:
        self.settler.forget(rel)
        job = self.jobs.remove_path(rel)
        dropped = delete_rows(self.store, [rel])
        if judge(rel).kind == "options":
            self._options_changed(rel)
            return
        extra = f"; left job {job.id}" if job else ""
        self.log("gone", rel, f"{why}{'; row dropped' if dropped else ''}{extra}")

    def _gone_under(self, prefix: str, why: str) -> None:
        def below(rel: str) -> bool:
            return not prefix or rel.startswith(prefix + "/")

        self.settler.forget_under(prefix)
        for job in list(self.jobs.jobs.values()):
            for rel in [r for r in job.paths if below(r)]:
                self.jobs.remove_path(rel)
        rows = [r for r in load_rows(self.store, self.root) if below(r)]
        delete_rows(self.store, rows)
        self.log("gone", prefix + "/", f"{why}; {len(rows)} source rows dropped")

    def _moved(self, src: str, dest: str) -> None:
        row = self.store.read_value("source", src) if src else None
        if src:
            self.gone(src, f"renamed to {dest}" if dest else "moved out of the folder")
        if not dest:
            return
        path = self.root / dest
        try:
            stat = stat_of(path)
        except OSError:
            return
        old = row_stat(row) if isinstance(row, dict) else None
        if old is not None and row.get("digest") and same_file(old, stat):
            # the same bytes under a new name: seed the stat cache, hash nothing
            remember(self.store, path, stat, row["digest"])
            self.settler.note(dest, closed=True, quiet_since=0.0)
            self.log("moved", dest, f"from {src}: same content, not rehashed")
        elif self.settler.note(dest, closed=True):
            self.log("settle", dest, "moved into place; waiting until it is still")

    def _arrived_dir(self, rel_dir: str, closed: bool) -> None:
        """A folder appeared (mkdir, or moved in whole): note every source in it."""
        found = 0
        for dirpath, dirnames, filenames in os.walk(self.root / rel_dir):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                rel = rel_of(self.root, Path(dirpath) / name)
                if judge(rel).kind is not None:
                    self.settler.note(rel, closed=closed)
                    found += 1
        how = "moved in" if closed else "created"
        self.log("settle", rel_dir + "/", f"folder {how}; {found} files waiting until still")

    def _options_changed(self, rel: str) -> None:
        persona = rel.split("/", 1)[0]
        self.keys.forget(persona)
        try:
            sources = list(persona_sources(self.root, persona))
        except OSError:
            sources = []
        for src in sources:
            self.settler.note(rel_of(self.root, src.path), closed=True, quiet_since=0.0)
        self.log("settle", rel, f"persona options changed; rechecking {len(sources)} sources")

    def ready(self, rel: str) -> None:
        if judge(rel).kind == "options":
            self._options_changed(rel)
            return
        src = source_at(self.root, rel)
        if src is None:
            self.jobs.remove_path(rel)
            delete_rows(self.store, [rel])
            self.log(
                "ignore", rel, "not a source in the catalog (a same-named still wins, or gone)"
            )
            return
        path = self.root / rel
        try:
            before = stat_of(path)
            digest = file_digest(self.store, path)
            after = stat_of(path)
        except FileChangedError:
            self.settler.note(rel)
            self.log("settle", rel, "changed while it was hashed; waiting until it is still")
            return
        except FileNotFoundError:
            self.gone(rel, "vanished before it was hashed")
            return
        except OSError as exc:
            self.outcomes.fail(rel, src, f"cannot read it ({exc.strerror}); fix its permissions")
            return
        if before != after:
            self.settler.note(rel)
            self.log("settle", rel, "changed while it was hashed; waiting until it is still")
            return
        try:
            recipe = self.keys.recipe_for(src.persona)
            avatar = self.keys.avatar(digest, recipe, src.kind)
        except (ValueError, LookupError, OSError) as exc:  # bad persona.toml, missing weights
            self.outcomes.fail(rel, src, f"{type(exc).__name__}: {exc}", stat=after, digest=digest)
            return
        if self.store.get_avatar(avatar) is not None:
            self.jobs.remove_path(rel)
            put_rows(self.store, {rel: new_row(self.root, src, after, digest, avatar, HOT)})
            self.outcomes.result(rel, src, HOT, None, "")
            self.log("hot", rel, f"content {digest[:12]} is hot already; nothing to precompile")
            return
        job, created = self.jobs.add(avatar, digest, recipe, rel, after)
        row = new_row(self.root, src, after, digest, avatar, RUNNING if job.running else QUEUED)
        row["attempts"] = job.attempts
        put_rows(self.store, {rel: row})
        if created:
            self.log("queued", rel, f"job {job.id} for content {digest[:12]}", job=job.id)
        else:
            first = next(iter(job.paths))
            self.log(
                "queued",
                rel,
                f"joins job {job.id}: same content as {first}",
                job=job.id,
                same_as=first,
            )
