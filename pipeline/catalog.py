"""Every source in the personas folder, and the avatar key each has under a recipe."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cachestore.hashcache import file_digest
from cachestore.store import Store
from pipeline.personas import (
    DEFAULT,
    PersonaError,
    inside,
    list_personas,
    read_options,
    scan_persona,
)
from pipeline.precompile.plan import Plan, plan
from pipeline.precompile.recipe import Recipe, effective_recipe


@dataclass(frozen=True)
class Source:
    persona: str
    attire: str
    motion: str
    path: Path
    kind: str  # "loop" or "still"


def iter_sources(root: Path) -> Iterator[Source]:
    """Each loop and still of each persona, in a stable order; files that resolve
    outside the personas folder (symlinks) are skipped, as the resolver refuses them."""
    for name in list_personas(root):
        try:
            persona = scan_persona(root, name)
        except (PersonaError, OSError):  # a persona folder that vanished or is a bad link
            continue
        for attire in persona.attires:
            found = [(m, p, "loop") for m, p in sorted(persona.loops.get(attire, {}).items())]
            if attire in persona.stills:
                found.append((DEFAULT, persona.stills[attire], "still"))
            for motion, path, kind in found:
                try:
                    inside(root, path)
                except PersonaError:
                    continue
                yield Source(name, attire, motion, path, kind)


def plan_for(store: Store | None, path: Path, recipe: Recipe) -> Plan:
    """Hash the file (stat cache first) and plan its stage keys under recipe: the plan
    precompile builds now, unless the store has no avatar under it but has one that an
    older frame format made (media.LEGACY_CODECS), which then serves renders (and gc
    keeps it) until the watcher, `sync` or a precompile builds the new one."""
    from pipeline.media import LEGACY_CODECS

    digest = file_digest(store, path)
    current = plan(digest, recipe)
    if store is None or store.read_value("avatar", current.avatar) is not None:
        return current
    for codec in LEGACY_CODECS:
        older = plan(digest, recipe, frame_codec=codec)
        if store.read_value("avatar", older.avatar) is not None:
            return older
    return current


def recipe_for(
    root: Path,
    persona: str,
    recipe: Recipe,
    backend: str = "",
    flags: Mapping[str, object] | None = None,
) -> Recipe:
    """`effective_recipe` for a persona's source: reads its persona.toml (what render, the
    watcher, the service, ls and gc use)."""
    return effective_recipe(
        recipe,
        read_options(root, persona),
        backend,
        flags,
        str(Path(root) / persona / "persona.toml"),
    )


def installed_recipes(recipe: Recipe) -> list[Recipe]:
    """The recipe of every renderer this installation renders with: the settings' own
    (its default renderer's) and each backend's whose weights are present. gc roots a
    source under each, so an avatar built for `--backend musetalk` is kept too."""
    from pipeline.nets.models import ModelMissingError
    from pipeline.render.renderers import RENDERERS
    from pipeline.render.renderers.musetalk import check_weights

    found = [recipe]
    for backend in RENDERERS:
        try:
            implied = effective_recipe(recipe, backend=backend)
            if backend == "musetalk":  # the VAE the backend implies, not the settings' ""
                check_weights(implied.models_dir, implied.vae or None)
            plan("0" * 32, implied)  # every stage's weights are here (its keys can be known)
        except ModelMissingError:
            continue
        if implied not in found:
            found.append(implied)
    return found
