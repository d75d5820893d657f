"""Reconcile: the personas folder against the store's `source` table.

Run at start and every few minutes, so that files added, changed, renamed or deleted
while the daemon was down (or in an inotify overflow) are caught. A file is
outstanding unless its row has the same stat, is hot under the current recipe and
its avatar is in the store; a row whose file is gone is dropped. A file that looks
like a gone row renamed (same device, inode, size and mtime) keeps that row's digest
and is not rehashed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cachestore.keys import FileStat
from cachestore.store import Store
from pipeline.catalog import Source, iter_sources
from pipeline.personas import DEFAULT, SPEECH, PersonaError, scan_persona
from watcher.events import judge
from watcher.sources import FAILED, HOT, load_rows, row_stat, same_file

# (source, digest) -> avatar key under that source's recipe
AvatarOf = Callable[[Source, str], str]


@dataclass(frozen=True)
class Outstanding:
    source: Source
    rel: str
    quiet_since: float  # wall time the file last changed (max of mtime and ctime)
    digest: str = ""  # known already (a rename of a known file), else ""


@dataclass
class Scan:
    outstanding: list[Outstanding] = field(default_factory=list)
    hot: list[str] = field(default_factory=list)  # unchanged and hot
    failed: list[str] = field(default_factory=list)  # unchanged, failed before: left alone
    gone: list[str] = field(default_factory=list)  # rows whose file is gone
    moved: dict[str, str] = field(default_factory=dict)  # new rel -> old rel
    seconds: float = 0.0


def rel_of(root: Path, path: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def persona_sources(root: Path, persona: str) -> Iterator[Source]:
    """The sources of one persona, exactly as pipeline.catalog.iter_sources lists them."""
    found = scan_persona(root, persona)
    for attire in found.attires:
        for motion, path in sorted(found.loops.get(attire, {}).items()):
            yield Source(persona, attire, motion, path, "loop")
        if attire in found.stills:
            yield Source(persona, attire, DEFAULT, found.stills[attire], "still")
    if found.speech is not None:
        yield Source(persona, SPEECH, DEFAULT, found.speech, "speech")


def source_at(root: Path, rel: str) -> Source | None:
    """The catalog's Source for rel, or None when rel is not one (gone, shadowed by a
    same-named still of another format, outside the layout)."""
    if judge(rel).kind not in ("still", "loop"):
        return None
    persona = rel.split("/", 1)[0]
    target = (Path(root) / rel).absolute()
    try:
        for src in persona_sources(root, persona):
            if src.path.absolute() == target:
                return src
    except (OSError, PersonaError):
        return None
    return None


def scan(
    root: Path,
    store: Store,
    avatar_of: AvatarOf,
    retry_failed: bool = False,
    under: str = "",
) -> Scan:
    """Compare the folder (or its subtree `under`) with the table; changes nothing."""
    start = time.perf_counter()
    root = Path(root)
    rows = load_rows(store, root)
    if under:
        rows = {k: v for k, v in rows.items() if k == under or k.startswith(under + "/")}
    result = Scan()
    seen: set[str] = set()
    fresh: list[tuple[Source, str, FileStat, float]] = []
    for src in iter_sources(root):
        rel = rel_of(root, src.path)
        if under and not (rel == under or rel.startswith(under + "/")):
            continue
        if judge(rel).kind is None:
            continue
        try:
            st = os.stat(src.path)
        except OSError:  # vanished mid-scan
            continue
        seen.add(rel)
        stat = FileStat.of(st)
        quiet = max(st.st_mtime, st.st_ctime)
        row = rows.get(rel)
        if row is not None and row_stat(row) == stat:
            verdict = _unchanged(row, src, store, avatar_of, retry_failed)
            if verdict is not None:
                (result.hot if verdict == HOT else result.failed).append(rel)
                continue
            result.outstanding.append(Outstanding(src, rel, quiet, row.get("digest", "")))
            continue
        fresh.append((src, rel, stat, quiet))
    result.gone = sorted(set(rows) - seen)
    # a gone row whose inode turns up under a new name was renamed while we were away
    by_inode = {}
    for rel in result.gone:
        st = row_stat(rows[rel])
        if st is not None and rows[rel].get("digest"):
            by_inode[(st.dev, st.ino)] = (rel, st)
    for src, rel, stat, quiet in fresh:
        digest = ""
        old = by_inode.get((stat.dev, stat.ino))
        if old is not None and same_file(old[1], stat):
            digest = rows[old[0]]["digest"]
            result.moved[rel] = old[0]
        result.outstanding.append(Outstanding(src, rel, quiet, digest))
    result.seconds = time.perf_counter() - start
    return result


def _unchanged(
    row: dict, src: Source, store: Store, avatar_of: AvatarOf, retry: bool
) -> str | None:
    """HOT or FAILED when a row with an unchanged stat needs nothing, else None."""
    try:
        avatar = avatar_of(src, row["digest"])
    except (KeyError, ValueError, OSError):
        return None
    if row.get("avatar") != avatar:
        return None  # the recipe (or persona.toml) changed since
    if row.get("state") == HOT and store.get_avatar(avatar) is not None:
        return HOT
    if row.get("state") == FAILED and not retry:
        return FAILED
    return None


def wait_until_settled(
    root: Path,
    store: Store,
    avatar_of: AvatarOf,
    alive: Callable[[], bool],
    tell: Callable[[int], None],
    every: float = 1.0,
) -> tuple[Scan, Scan]:
    """(the first scan, the last): scan the folder every `every` seconds until nothing in
    it is outstanding, while another process builds it (`hotplate serve --watch`'s
    watcher, which `alive` says still holds the lock; `tell` hears how many are left).
    Raises RuntimeError naming what is left when that process stops first."""
    first = last = scan(root, store, avatar_of)
    while last.outstanding:
        if not alive():
            left = ", ".join(o.rel for o in last.outstanding[:5])
            more = len(last.outstanding) - 5
            raise RuntimeError(
                f"the server watching {root} stopped with {len(last.outstanding)} file(s) "
                f"outstanding ({left}{f' and {more} more' if more > 0 else ''}); run "
                "`hotplate sync` again"
            )
        tell(len(last.outstanding))
        time.sleep(every)  # the server's watcher works meanwhile; this only looks
        last = scan(root, store, avatar_of)
    return first, last
