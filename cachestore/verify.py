"""Walk every manifest and check what it names, as diskcache's check() does."""

from __future__ import annotations

from dataclasses import dataclass

from cachestore import codec
from cachestore.store import Store


@dataclass(frozen=True)
class Problem:
    kind: str  # "missing-blob", "bad-blob", "missing-stage", "unreadable"
    where: str  # "stage:<key>" or "avatar:<key>"
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}\t{self.where}\t{self.detail}"


def verify(store: Store) -> tuple[int, list[Problem]]:
    """Check every blob each manifest names exists and matches its checksum.

    Returns (manifests checked, problems). Reads only; a damaged store is reported,
    never repaired here (gc and a re-precompile do that).
    """
    problems: list[Problem] = []
    checked = 0
    with store.read() as r:
        stage_keys = set()
        for key, rec in r.items("stage"):
            checked += 1
            stage_keys.add(key)
            for name, digest in rec["blobs"].items():
                value = r.txn.get(digest.encode(), db=store.dbs["blob"])
                if value is None:
                    problems.append(Problem("missing-blob", f"stage:{key}", f"{name} -> {digest}"))
                    continue
                try:
                    codec.check(value, digest)
                except codec.CodecError as exc:
                    problems.append(
                        Problem("bad-blob", f"stage:{key}", f"{name} -> {digest}: {exc}")
                    )
        for key, rec in r.items("avatar"):
            checked += 1
            for name, stage in rec["stages"].items():
                if stage not in stage_keys:
                    problems.append(Problem("missing-stage", f"avatar:{key}", f"{name} -> {stage}"))
    return checked, problems
