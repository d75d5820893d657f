"""Rebuild damaged avatars from their sources: what `hotplate verify --repair` does.

An avatar manifest records its source path, the digest of the bytes it was made from
and its recipe. Repair re-runs precompile on that source under that recipe, which
finds the damaged stages on its hit path and rebuilds exactly those. It refuses,
saying why, when the source is gone, holds other bytes now, or the recipe no longer
gives the same avatar key (other weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cachestore.hashcache import file_digest
from cachestore.store import Store
from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe

REBUILT, SOURCE_GONE, SOURCE_CHANGED, CANNOT = "rebuilt", "source-gone", "source-changed", "cannot"


@dataclass(frozen=True)
class Repair:
    avatar: str
    source: str
    damaged: list[str]  # stage names found damaged
    outcome: str  # REBUILT, SOURCE_GONE, SOURCE_CHANGED or CANNOT
    detail: str

    def __str__(self) -> str:
        return f"{self.outcome}\tavatar:{self.avatar}\t{self.source}\t{self.detail}"


def damaged_avatars(store: Store) -> dict[str, list[str]]:
    """Avatar key -> names of its stages that are missing or name a damaged blob."""
    found = {}
    for key, manifest in store.items("avatar"):
        damaged = store.damaged_stages(manifest["stages"])
        if damaged:
            found[key] = damaged
    return found


def repair(store: Store, models_dir: Path | None = None) -> list[Repair]:
    """Rebuild every damaged avatar from its source; one Repair per damaged avatar."""
    results = []
    for key, damaged in damaged_avatars(store).items():
        manifest = store.read_value("avatar", key)
        outcome, detail = _repair_one(store, key, manifest, damaged, models_dir)
        results.append(Repair(key, manifest["source"], damaged, outcome, detail))
    return results


def _repair_one(
    store: Store, key: str, manifest: dict, damaged: list[str], models_dir: Path | None
) -> tuple[str, str]:
    from pipeline.precompile.run import precompile

    source = Path(manifest["source"])
    if "recipe" not in manifest:
        return CANNOT, (
            "made by an older hotplate that did not record its recipe; "
            "run `hotplate precompile` on the source again"
        )
    if not source.is_file():
        return SOURCE_GONE, (
            f"{source} is gone; put it back and run `hotplate verify --repair` again, "
            f"or let gc remove the avatar"
        )
    if file_digest(store, source) != manifest["source_digest"]:
        return SOURCE_CHANGED, (
            f"{source} now holds other bytes than the avatar was made from; "
            f"`hotplate precompile` makes the new content hot, gc removes the old avatar"
        )
    # an avatar made before the still stage existed was made without it
    recipe = Recipe(**{"still": "off", **manifest["recipe"]}, models_dir=models_dir)
    bank = manifest.get("kind") == "bank"  # a mouth bank's record (its recipe as built)
    if plan(manifest["source_digest"], recipe, bank).avatar != key:
        return CANNOT, (
            "the models it was made with are not in the models directory any more "
            "(other weights give another avatar)"
        )
    try:
        precompile(source, recipe, store, bank=bank)
    except (OSError, ValueError, RuntimeError, LookupError) as exc:
        return CANNOT, f"precompile failed: {exc}"
    return REBUILT, f"stages {', '.join(damaged)} rebuilt from {source}"
