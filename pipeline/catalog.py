"""Every source in the personas folder, and the avatar key each has under a recipe."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
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


@dataclass(frozen=True)
class Read:
    """One record a render of a source reads: its avatar, or a mouth bank it may take."""

    kind: str  # "avatar" or "bank"
    path: Path  # the file the record is made from
    plan: Plan

    @property
    def key(self) -> str:
        return self.plan.avatar

    @property
    def named(self) -> dict[str, str]:
        """The stages its record names (name -> key): a bank's names its bank stage alone
        (its first stages are the clip's avatar's), so that is what a pull may write."""
        return {"bank": self.plan.stages["bank"]} if self.kind == "bank" else self.plan.stages


def render_reads(
    store: Store | None, root: Path, src: Source, recipe: Recipe, avatar: bool = True
) -> list[Read]:
    """Every record a render of `src` may read, in the order a render chooses among its
    banks (`persona_bank`): its avatar (a speech clip has none; `avatar=False` leaves it
    out), then the banks of its persona's clips: the source's own, speech.mp4's, every
    other loop's. The one answer to "what does this avatar need": push and pull carry
    these records, a render pulls the banks among them from the tier (and so does the
    Ray fleet's, through the same miss hook), gc roots them and a render leases the one it
    takes. A bank absent from the store costs nothing: not every clip has one."""
    reads = []
    if avatar and src.kind != "speech":
        reads.append(Read("avatar", src.path, plan_for(store, src.path, recipe)))
    for kind, path in _bank_clips(root, src.persona, src.path if src.kind == "loop" else None):
        try:
            reads.append(Read("bank", path, bank_plan(store, path, recipe, kind)))
        except OSError:  # a clip that vanished since it was listed has no bank to read
            continue
    if src.kind == "speech" and not any(r.path == src.path for r in reads):
        reads.append(Read("bank", src.path, bank_plan(store, src.path, recipe, "speech")))
    return reads


def _bank_clips(root: Path, persona: str, rendered: Path | None) -> list[tuple[str, Path]]:
    """(kind, clip) of each clip whose bank a render of `rendered` may take, best first:
    the rendered loop's own (its mouths were shot in its light and pose), speech.mp4's,
    then every other loop (by attire, then motion)."""
    own = [] if rendered is None else [rendered]  # a named file's own, in a persona or not
    try:
        found = scan_persona(root, persona)
    except (PersonaError, OSError):
        return [("loop", p) for p in own]
    loops = [p for a in sorted(found.loops) for _, p in sorted(found.loops[a].items())]
    own = [p for p in loops if rendered is not None and p.resolve() == rendered.resolve()] or own
    clips = [("loop", p) for p in own]
    clips += [("speech", found.speech)] if found.speech is not None else []
    clips += [("loop", p) for p in loops if p not in own]
    return clips


def rooted_keys(store: Store | None, root: Path, src: Source, recipe: Recipe) -> list[str]:
    """What a source keeps from gc: every record a render of it reads (`render_reads`;
    rooted whether or not it was built: an absent key costs nothing)."""
    return [r.key for r in render_reads(store, root, src, recipe)]


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
        # [min, max] of the footage's openings (`mouth.bank.opening_range`: inner-lip gap
        # over the inter-ocular distance); None for an empty bank
        "opening_range": manifest.get("opening_range") if manifest.get("entries") else None,
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
    if info.get("opening_range"):
        lo, hi = info["opening_range"]
        said += f", openings {lo:.3f}-{hi:.3f}"
    late = info.get("sound_late_ms", 0)
    if late:
        said += (
            f", its sound {abs(late)} ms {'after' if late > 0 else 'before'} its pictures (aligned)"
        )
    return said


def persona_bank(
    store: Store,
    root: Path,
    persona: str,
    recipe: Recipe,
    rendered: Path | None = None,
    pull: Callable[[Read], object] | None = None,
) -> tuple[str, Path] | None:
    """(key, clip) of the persona's mouth bank a render uses: the first of `render_reads`'
    banks (the rendered loop's own, else `speech.mp4`'s, else the first loop's) that holds
    mouths; it must be hot (whole, `pipeline.hot.hot_check`). `pull(read)`, when given, is
    asked for each bank cold here before it is looked at (a render's ask of the blob tier).
    None when the persona has none."""
    from pipeline.hot import hot_check
    from pipeline.media import is_still

    loop = rendered is not None and not is_still(rendered)
    src = Source(persona, "", "", rendered or Path(), "loop" if loop else "still")
    for read in render_reads(store, root, src, recipe, avatar=False):
        info = bank_info(store, read.key)
        if info is None and pull is not None:
            pull(read)
            info = bank_info(store, read.key)
        if info is not None and info["entries"] > 0 and not hot_check(store, read.key)[1]:
            return read.key, read.path
    return None
