"""The daemon's intake: changes -> settle -> hash -> hot already, or a job."""

from __future__ import annotations

import os
from pathlib import Path

from cachestore.hashcache import file_digest, remember
from cachestore.keys import FileChangedError, FileStat
from pipeline.catalog import Source
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
from watcher.reconcile import persona_sources, rel_of, source_at
from watcher.sources import (
    FAILED,
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


class Intake:
    # -- changes ------------------------------------------------------------------------

    def _on_change(self, ch: Change) -> None:
        kind = ch.kind
        if kind == IGNORED:
            self.log("ignore", ch.path, ch.reason)
        elif kind == OVERFLOW:
            self.log("warning", msg="the kernel dropped file events (overflow); reconciling")
            self._next_rescan = 0.0
        elif kind in (CREATED, MODIFIED, CLOSED):
            if self.settler.note(ch.path, closed=kind == CLOSED):
                wait_for = (
                    "still" if kind == CLOSED or self.mode != "inotify" else "closed and still"
                )
                self.log("settle", ch.path, f"{kind}; waiting until it is {wait_for}")
        elif kind == DELETED:
            self._gone(ch.path, "deleted")
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
            self._fatal = (
                f"the personas folder {self.root} was deleted or moved away; nothing is watched "
                f"any more, so the watcher stops (start it again once the folder is back)"
            )
            self.log("warning", msg=self._fatal)
            self.stop()
        elif kind == DIR_DELETED:
            self._gone_under(ch.path, "deleted")

    def _gone(self, rel: str, why: str) -> None:
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
            self._gone(src, f"renamed to {dest}" if dest else "moved out of the folder")
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
        self._recipes.pop(persona, None)
        try:
            sources = list(persona_sources(self.root, persona))
        except OSError:
            sources = []
        for src in sources:
            self.settler.note(rel_of(self.root, src.path), closed=True, quiet_since=0.0)
        self.log("settle", rel, f"persona options changed; rechecking {len(sources)} sources")

    # -- ready: hash and queue ----------------------------------------------------------

    def _ready(self, rel: str) -> None:
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
            self._gone(rel, "vanished before it was hashed")
            return
        except OSError as exc:
            self._fail_row(rel, src, f"cannot read it ({exc.strerror}); fix its permissions")
            return
        if before != after:
            self.settler.note(rel)
            self.log("settle", rel, "changed while it was hashed; waiting until it is still")
            return
        try:
            recipe = self._recipe_for(src.persona)
            avatar = self._avatar(digest, recipe)
        except (ValueError, LookupError, OSError) as exc:  # bad persona.toml, missing weights
            self._fail_row(rel, src, f"{type(exc).__name__}: {exc}", stat=after, digest=digest)
            return
        if self.store.get_avatar(avatar) is not None:
            self.jobs.remove_path(rel)
            put_rows(self.store, {rel: new_row(self.root, src, after, digest, avatar, HOT)})
            self._result(rel, src, HOT, None, "")
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
            self.log("queued", rel, f"joins job {job.id}: same content as {first}", job=job.id)

    def _fail_row(
        self, rel: str, src: Source, error: str, stat: FileStat | None = None, digest: str = ""
    ) -> None:
        try:
            stat = stat or stat_of(self.root / rel)
        except OSError:
            return
        row = new_row(self.root, src, stat, digest, "", FAILED)
        row["error"] = error
        put_rows(self.store, {rel: row})
        self._error(rel, error, 1, final=True)
        self._result(rel, src, FAILED, None, error)
        self.summary.failed += 1
        self.log("job-failed", rel, error)
