"""The store commands: resolve, ls, status, gc, verify and doctor.

Only light modules are imported at the top, so these start fast; each command imports
what it needs. Registered on the group by `hotplate/cli/__init__.py`, like `watch.py`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from hotplate.cli.common import default_help, open_cache, settings_of, source_options
from hotplate.output import human_bytes, table
from hotplate.settings import SETTINGS, Settings
from pipeline.render.renderers import RENDERERS

SETTING_DEFAULTS = {name: row[1]() for name, row in SETTINGS.items()}  # for the help texts

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (stable keys) for scripts."
)


def echo_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


def present(settings: Settings) -> bool:
    return (settings.cache / "data.mdb").exists() or settings.cache.is_file()


@click.command()
@source_options
@click.option(
    "--backend",
    type=click.Choice(RENDERERS),
    help="Renderer whose recipe to resolve (musetalk implies upstream's)."
    + default_help("the settings' renderer"),
)
@json_option
@click.pass_context
def resolve(
    ctx: click.Context,
    persona: str,
    attire: str,
    motion: str | None,
    video: Path | None,
    backend: str | None,
    as_json: bool,
) -> None:
    """Print the source file, its digest, the recipe, the avatar key and whether it is hot."""
    from pipeline.catalog import plan_for
    from pipeline.hot import hot_check
    from pipeline.personas import resolve as resolve_source
    from pipeline.precompile.recipe import describe, effective_recipe

    settings = settings_of(ctx)
    found = resolve_source(settings.personas, persona, attire, motion, video)
    store = open_cache(settings, fallback_readonly=True) if present(settings) else None
    source = f"{found.persona}/persona.toml"
    recipe = effective_recipe(
        settings.recipe, found.options, backend or settings.renderer, source=source
    )
    p = plan_for(store, found.path, recipe)
    # hot as render and precompile decide it (pipeline.hot.hot_check): whole, not only there
    manifest, damaged = hot_check(store, p.avatar) if store is not None else (None, [])
    hot = manifest is not None and not damaged
    bank = None
    if (backend or settings.renderer) == "warp" and store is not None:
        from pipeline.catalog import bank_info, persona_bank

        found_bank = persona_bank(store, settings.personas, found.persona, recipe, found.path)
        bank = (
            None
            if found_bank is None
            else {**bank_info(store, found_bank[0]), "clip": str(found_bank[1])}
        )
    no_bank = None if bank is not None else not_talking(store, found.path, recipe)
    mouth = None
    if (backend or settings.renderer) == "warp":
        from pipeline.media import is_still
        from pipeline.render.mouth.library import library_path, mouth_kind

        mouth = {"kind": mouth_kind(bank is not None, is_still(found.path))}
        if mouth["kind"] in ("library", "painted+library"):
            mouth["library"] = str(library_path())
    why = None if hot or store is None else why_cold(store, p)
    if damaged:
        why = f"stages {', '.join(damaged)} are damaged in the store; a render or precompile rebuilds them"
    if as_json:
        echo_json(
            {
                "source": str(found.path),
                "rule": found.rule,
                "recipe": recipe.fields(),
                "digest": p.source_digest,
                "avatar": p.avatar,
                "state": "hot" if hot else "cold",
                "why": why,
                "bank": bank,
                "no_bank": no_bank,  # the loop's own footage judged not talking: why
                "mouth": mouth,
            }
        )
        return
    click.echo(f"source   {found.path}  ({found.rule})")
    click.echo(f"recipe   {describe(recipe)}")
    click.echo(f"digest   {p.source_digest}")
    click.echo(f"avatar   {p.avatar}")
    click.echo(f"state    {'hot' if hot else 'cold'}")
    if why:
        click.echo(f"why      {why}")
    if bank is not None:
        from pipeline.catalog import describe_bank

        click.echo(f"bank     {bank['key']}  {Path(bank['clip']).name}: {describe_bank(bank)}")
    elif (backend or settings.renderer) == "warp" and no_bank is not None:
        click.echo(f"bank     none: {found.path.name} judged not talking: {no_bank}")
    elif (backend or settings.renderer) == "warp":
        click.echo(
            f"bank     none: the mouth below (a hot bank needs talking footage: "
            f"{found.persona}/speech.mp4 or a loop shot while speaking, precompiled)"
        )
    if mouth is not None:
        click.echo(f"mouth    {MOUTHS[mouth['kind']]}")


MOUTHS = {  # what `hotplate resolve` says of the mouth a warp render shows
    "bank": "bank: the presenter's own mouths, from their footage",
    "library": "library: real mouths from the default mouth library, matched to the face",
    "painted+library": "painted (a loop with no bank); under a frame's own teeth, the"
    " library's cavity and lower teeth",
    "painted": "painted (the mouth library unreadable or off)",
}


def not_talking(store, path: Path, recipe) -> str | None:
    """Why a loop's own footage made no bank, with the figure it was judged on (its
    empty bank's record, `pipeline.mouth.bank.build_bank`), or None: a still, a loop not
    yet precompiled, or one whose bank holds mouths."""
    from pipeline.catalog import bank_info, bank_plan
    from pipeline.media import is_still

    if store is None or is_still(path):
        return None
    try:
        info = bank_info(store, bank_plan(store, path, recipe, "loop").avatar)
    except OSError:  # the file vanished since it was resolved
        return None
    return info["reason"] if info is not None and info["entries"] == 0 else None


def why_cold(store, p) -> str:
    """Name the first stage that is missing, like dagster's stale causes."""
    for name, key in p.stages.items():
        if store.get_stage(key) is None:
            return (
                f"stage {name} is not in the store (new source, parameter or model from here down)"
            )
    return "every stage is present but the avatar manifest is not: a precompile will only link them"


@click.command(name="ls")
@json_option
@click.pass_context
def ls_cmd(ctx: click.Context, as_json: bool) -> None:
    """List personas, attires and motions, hot or cold, with their size in the store,
    and each video's mouth bank (any loop shot while speaking, with or without sound; a
    persona's speech.mp4)."""
    from pipeline.catalog import bank_info, bank_plan, iter_sources, plan_for, recipe_for

    settings = settings_of(ctx)
    store = open_cache(settings, fallback_readonly=True) if present(settings) else None
    found = []
    for src in iter_sources(settings.personas):
        recipe = recipe_for(settings.personas, src.persona, settings.recipe)
        bank = None
        if src.kind != "still":
            info = bank_info(store, bank_plan(store, src.path, recipe, src.kind).avatar)
            # every loop's precompile asks whether it talks, sound or not (precompile_source):
            # an empty bank's record says why not ("reason", with the figure)
            bank = {"state": "cold"} if info is None else {"state": "hot", **info}
        if src.kind == "speech":  # only a bank: its row is the bank's
            p_avatar = bank.get("key") or bank_plan(store, src.path, recipe, "speech").avatar
            size = store.avatar_bytes(p_avatar) if store and bank["state"] == "hot" else None
        else:
            p_avatar = plan_for(store, src.path, recipe).avatar
            size = store.avatar_bytes(p_avatar) if store else None  # None: cold (or gc'd)
        found.append(
            {
                "persona": src.persona,
                "attire": src.attire,
                "motion": src.motion,
                "kind": src.kind,
                "state": "cold" if size is None else "hot",
                "bytes": size or 0,
                "file": str(src.path),
                "avatar": p_avatar,
                "bank": bank,
            }
        )
    if as_json:
        echo_json({"personas": str(settings.personas), "sources": found})
        return
    if not found:
        click.echo(f"no personas in {settings.personas}; see personas/README.md for the layout")
        return
    columns = ("persona", "attire", "motion", "kind", "state")
    rows = [
        (
            *(f[c] for c in columns),
            human_bytes(f["bytes"]) if f["state"] == "hot" else "-",
            bank_cell(f["bank"]),
            Path(f["file"]).name,
        )
        for f in found
    ]
    table((*columns, "size", "bank", "file"), rows)


def bank_cell(bank: dict | None) -> str:
    """The `bank` column of `ls`: '-' for stills, mouths in a hot bank, quiet (a loop
    that does not talk: its bank is empty), cold."""
    if bank is None:
        return "-"
    if bank["state"] != "hot":
        return "cold"
    return f"{bank['entries']} mouths" if bank["entries"] else "quiet"


@click.command()
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Store statistics, live render leases and, when the watcher runs, daemon health."""
    settings = settings_of(ctx)
    facts = store_facts(settings)
    if as_json:
        facts["daemon"] = daemon_lines(settings)
        echo_json(facts)
        return
    click.echo(f"store    {settings.cache}")
    if not facts["present"]:
        click.echo("         (empty: nothing precompiled yet)")
    else:
        click.echo(
            f"file     {human_bytes(facts['file_bytes'])} on disk, "
            f"map {human_bytes(facts['map_size'])}"
        )
        table(
            ("db", "entries", "bytes"),
            [(db, n, human_bytes(facts["bytes"][db])) for db, n in facts["entries"].items()],
        )
        counters = (
            ", ".join(
                f"{k} {human_bytes(v) if k.startswith('bytes') else v}"
                for k, v in sorted(facts["counters"].items())
            )
            or "none"
        )
        click.echo(f"counters {counters}")
        if facts["last_gc"]:
            g = facts["last_gc"]
            click.echo(
                f"last gc  {clock(g['time'])}: deleted {g['deleted']} of {g['of']} entries, "
                f"reclaimed {human_bytes(g['reclaimed'])}"
            )
    for lease in facts["leases"]:
        click.echo(
            f"lease    pid {lease['pid']} ({lease['command']}) since {clock(lease['since'])}: "
            f"{', '.join(k[:16] for k in lease['keys'])}"
        )
    for line in daemon_lines(settings):
        click.echo(line)


def clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def store_facts(settings: Settings) -> dict:
    """What `status` shows, as plain data: the --json output and the text's source."""
    from cachestore.leases import live_leases
    from cachestore.stats import store_stats

    facts: dict = {"store": str(settings.cache), "present": present(settings)}
    if facts["present"]:
        stats = store_stats(open_cache(settings, readonly=True))
        facts.update(
            file_bytes=stats.file_bytes,
            map_size=stats.map_size,
            entries=stats.entries,
            bytes=stats.bytes,
            counters=stats.counters,
            last_gc=stats.last_gc,
        )
    facts["remote"] = remote_facts(settings, facts.get("counters", {}))
    facts["leases"] = [
        {**info.holder.record(), "keys": list(info.keys)}
        for info in live_leases(settings.cache, clean=False)
    ]
    return facts


REMOTE_COUNTERS = (
    "pulls", "bytes_pulled", "remote_hits", "remote_misses", "remote_damaged",
    "pushes", "bytes_pushed", "push_failures",
)  # fmt: skip


def remote_facts(settings: Settings, counters: dict) -> dict:
    """The blob tier this store uses and its counters (0 until counted; cachestore/remote/pull.py)."""
    from cachestore.remote.tier import remote_url

    url = settings.remote or remote_url(settings.cache)
    return {"url": url or None, **{k: counters.get(k, 0) for k in REMOTE_COUNTERS}}


def daemon_lines(settings: Settings) -> list[str]:
    try:
        from watcher.health import describe
    except ImportError:  # the watcher is optional for status
        return []
    return describe(settings.cache)


@click.command()
@click.option(
    "--grace",
    default=None,
    type=float,
    help="Keep anything used within this many hours."
    + default_help(SETTING_DEFAULTS["grace_hours"], env="HOTPLATE_GRACE_HOURS"),
)
@click.option(
    "--max-size", help="Evict least-recently-used avatars until the store fits, e.g. 20G, 500M."
)
@click.option(
    "--dry-run", is_flag=True, help="Print exactly what would be deleted, delete nothing."
)
@click.option(
    "--compact",
    is_flag=True,
    help="Afterwards rewrite the store file compactly (needs no other process using it).",
)
@click.option("--pin", multiple=True, help="Also keep this avatar key (may repeat).")
@click.pass_context
def gc(
    ctx: click.Context,
    grace: float | None,
    max_size: str | None,
    dry_run: bool,
    compact: bool,
    pin: tuple[str, ...],
) -> None:
    """Delete what no persona needs: unrooted, unused, unpinned entries."""
    from cachestore.compact import compact as compact_store
    from cachestore.gc import collect
    from pipeline.catalog import installed_recipes, iter_sources, recipe_for, rooted_keys

    settings = settings_of(ctx)
    # a dry run writes nothing: read-only store, --pin keys only count as roots
    store = open_cache(settings, readonly=dry_run)
    for key in pin if not dry_run else ():
        store.put("pin", key, {"time": time.time()})
    roots = set(pin)
    recipes = installed_recipes(settings.recipe)  # every renderer's whose weights are here
    for src in iter_sources(settings.personas):
        try:
            for recipe in recipes:
                persona_recipe = recipe_for(settings.personas, src.persona, recipe)
                roots.update(rooted_keys(store, settings.personas, src, persona_recipe))
        except OSError as exc:  # a file vanished mid-scan: it roots nothing
            click.echo(f"skipping {src.path}: {exc}", err=True)
    hours = settings.grace_hours if grace is None else grace
    plan = collect(store, roots, grace=hours * 3600, max_size=parse_size(max_size), dry_run=dry_run)
    if dry_run:
        for line in plan.lines():
            click.echo(line)
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{verb} {plan.deleted} of {plan.total_entries} entries, "
        f"reclaimed {human_bytes(plan.reclaimed)} of {human_bytes(plan.total_bytes)}"
    )
    if compact and not dry_run:
        before, after = compact_store(settings.cache)
        click.echo(f"compacted {human_bytes(before)} -> {human_bytes(after)}")


def parse_size(text: str | None) -> int | None:
    from cachestore.space import parse_size as size_of

    if text is None:
        return None
    try:
        return size_of(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-size") from None


@click.command()
@json_option
@click.option(
    "--repair",
    is_flag=True,
    help="Rebuild damaged avatars from their sources (the paths their manifests record) "
    "and say which could not be (source gone or changed).",
)
@click.pass_context
def verify(ctx: click.Context, as_json: bool, repair: bool) -> None:
    """Check every manifest's blobs exist and match their checksums; exit 1 on damage."""
    from cachestore.verify import verify as verify_store

    settings = settings_of(ctx)
    store = open_cache(settings, readonly=not repair)
    if repair:
        from pipeline.precompile.repair import REBUILT
        from pipeline.precompile.repair import repair as repair_store

        for result in repair_store(store, settings.models):
            if not as_json:
                click.echo(str(result))
            if result.outcome != REBUILT:
                click.echo(
                    f"could not repair avatar {result.avatar[:12]}: {result.detail}", err=True
                )
    checked, problems = verify_store(store)
    if as_json:
        echo_json(
            {
                "store": str(store.path),
                "checked": checked,
                "ok": not problems,
                "problems": [
                    {"kind": p.kind, "where": p.where, "detail": p.detail} for p in problems
                ],
            }
        )
    else:
        for problem in problems:
            click.echo(str(problem))
        click.echo(f"checked {checked} manifests: {len(problems)} problems")
    if problems:
        sys.exit(1)


@click.command()
@click.pass_context
def doctor(ctx: click.Context) -> None:
    """Check Python, packages, backends, weights, codecs and the cache directory."""
    from hotplate.doctor import run_checks

    failed = 0
    for check in run_checks(settings_of(ctx)):
        mark = "ok  " if check.ok else ("warn" if check.optional else "FAIL")
        failed += not check.ok and not check.optional
        click.echo(
            f"{mark}  {check.name}: {check.detail}"
            + ("" if check.ok else f"\n      fix: {check.fix}")
        )
    sys.exit(1 if failed else 0)


STORE_COMMANDS = (resolve, ls_cmd, status, gc, verify, doctor)
