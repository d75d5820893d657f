"""Every source in the personas folder, and the avatar key each has under a recipe."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cachestore.hashcache import file_digest
from cachestore.store import Store
from pipeline.personas import (
    DEFAULT,
    SPEECH,
    PersonaError,
    inside,
    list_personas,
    read_options,
    scan_persona,
)
from pipeline.precompile.plan import Plan, plan
from pipeline.precompile.recipe import Recipe, effective_recipe, for_speech


@dataclass(frozen=True)
class Source:
    persona: str
    attire: str
    motion: str
    path: Path
    kind: str  # "loop", "still", or "speech" (talking footage: only a mouth bank)


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
        if persona.speech is not None:
            try:
                inside(root, persona.speech)
            except PersonaError:
                continue
            yield Source(name, SPEECH, DEFAULT, persona.speech, "speech")


def plan_for(store: Store | None, path: Path, recipe: Recipe) -> Plan:
    """Hash the file (stat cache first) and plan its stage keys under recipe: the plan
    precompile builds now, unless the store has no avatar under it but has one that an
    older hotplate made, which then serves renders (and gc keeps it) until the watcher,
    `sync` or a precompile builds the new one: one without the still stage (made before
    it existed), or in an older frame format (media.LEGACY_CODECS)."""
    from pipeline.media import FRAME_CODEC, LEGACY_CODECS

    digest = file_digest(store, path)
    current = plan(digest, recipe)
    if store is None or store.read_value("avatar", current.avatar) is not None:
        return current
    recipes = [recipe] if recipe.still == "off" else [recipe, recipe.replace(still="off")]
    for codec in (FRAME_CODEC, *LEGACY_CODECS):
        for older_recipe in recipes:
            if codec == FRAME_CODEC and older_recipe is recipe:
                continue  # that is `current`
            older = plan(digest, older_recipe, frame_codec=codec)
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


# -- mouth banks: a video's talking footage (pipeline/mouth/bank.py) -------------------


def bank_plan(store: Store | None, path: Path, recipe: Recipe, kind: str) -> Plan:
    """The plan of a video's mouth bank (`kind` "speech": a persona's speech.mp4, read
    whole up to a minute; else a loop, whose first stages are its avatar's)."""
    return plan(file_digest(store, path), for_speech(recipe) if kind == "speech" else recipe, True)


def rooted_keys(store: Store | None, src: Source, recipe: Recipe) -> list[str]:
    """What a source keeps from gc: its avatar (a speech clip has none) and, for a
    video, its mouth bank (rooted whether or not it was built: an absent key costs
    nothing)."""
    keys = [] if src.kind == "speech" else [plan_for(store, src.path, recipe).avatar]
    if src.kind != "still":
        keys.append(bank_plan(store, src.path, recipe, src.kind).avatar)
    return keys


def bank_info(store: Store | None, key: str) -> dict | None:
    """A mouth bank's record as `ls` and `resolve` show it (entries, why empty, source,
    seconds of footage), or None when it is not in the store."""
    if store is None:
        return None
    manifest = store.get_avatar(key)
    if manifest is None or manifest.get("kind") != "bank":
        return None
    fps = float(manifest.get("fps") or 25.0)
    return {
        "key": key,
        "entries": int(manifest.get("entries", 0)),
        "reason": manifest.get("reason", ""),
        "source": manifest.get("source", ""),
        "seconds": round(int(manifest.get("frames", 0)) / fps, 2),
        # ms the footage's sound came after its pictures (negative: before), aligned for
        # the bank's model (`mouth.bank.sound_offset`); 0 where it sat in sync
        "sound_late_ms": int((manifest.get("sound_late") or {}).get("ms", 0)),
    }


def describe_bank(info: dict | None) -> str:
    """A few words for a bank: '352 mouths from 14.1 s of footage', 'empty (why)', 'cold'."""
    if info is None:
        return "cold (not precompiled under this recipe)"
    if info["entries"] == 0:
        return f"empty ({info['reason']})"
    said = f"{info['entries']} mouths from {info['seconds']:g} s of footage"
    late = info.get("sound_late_ms", 0)
    if late:
        said += (
            f", its sound {abs(late)} ms {'after' if late > 0 else 'before'} its pictures (aligned)"
        )
    return said


def persona_bank(
    store: Store, root: Path, persona: str, recipe: Recipe, rendered: Path | None = None
) -> tuple[str, Path] | None:
    """(key, clip) of the persona's mouth bank a render uses: the rendered loop's own
    (`rendered`: its mouths were shot in its light and pose), else `speech.mp4`'s, else the
    first loop (by attire, then motion) whose bank holds mouths; it must be hot (whole,
    `pipeline.hot.hot_check`). None when the persona has none."""
    from pipeline.hot import hot_check

    try:
        found = scan_persona(root, persona)
    except (PersonaError, OSError):
        return None
    loops = [p for a in sorted(found.loops) for _, p in sorted(found.loops[a].items())]
    own = [p for p in loops if rendered is not None and p.resolve() == rendered.resolve()]
    clips = [("loop", p) for p in own]
    clips += [("speech", found.speech)] if found.speech is not None else []
    clips += [("loop", p) for p in loops if p not in own]
    for kind, path in clips:
        try:
            key = bank_plan(store, path, recipe, kind).avatar
        except OSError:
            continue
        info = bank_info(store, key)
        if info is not None and info["entries"] > 0 and not hot_check(store, key)[1]:
            return key, path
    return None
