"""The `hotplate` command. Only light modules are imported here so that resolve,
status, ls and gc start fast; precompile and render import their stages lazily."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from hotplate.output import human_bytes, table
from hotplate.settings import Settings, SettingsError, load_settings
from pipeline.precompile.recipe import CROP_RULES, DETECTORS, LANDMARKERS, MASKERS, PARSING_MODES

# Exceptions whose message is already one line for the user: no traceback for these.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    OSError,
    RuntimeError,
    LookupError,
    SettingsError,
)


class HotplateGroup(click.Group):
    """Turns expected failures into one readable line and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except USER_ERRORS as exc:
            if ctx.meta.get("hotplate.debug"):
                raise
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)


def settings_of(ctx: click.Context) -> Settings:
    return ctx.find_object(Settings)


def open_cache(settings: Settings, readonly: bool = False):
    from cachestore.store import open_store

    # a cache path that is a file goes on to open_store, which names the problem
    if readonly and not settings.cache.is_file() and not (settings.cache / "data.mdb").exists():
        raise FileNotFoundError(
            f"no store at {settings.cache} yet; run `hotplate precompile` or `hotplate sync` first"
        )
    return open_store(settings.cache, readonly=readonly)


@click.group(cls=HotplateGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--personas",
    type=click.Path(path_type=Path),
    help="Personas folder [env HOTPLATE_PERSONAS; default ./personas].",
)
@click.option(
    "--cache",
    type=click.Path(path_type=Path),
    help="Store directory [env HOTPLATE_CACHE; default ~/.cache/hotplate/store].",
)
@click.option(
    "--models",
    type=click.Path(path_type=Path),
    help="Models directory for weights you provide [env HOTPLATE_MODELS].",
)
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Settings file [default ./hotplate.toml if present].",
)
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(
    ctx: click.Context,
    personas: Path | None,
    cache: Path | None,
    models: Path | None,
    config: Path | None,
    debug: bool,
) -> None:
    """Keep talking-head avatar assets hot for real-time lip-sync.

    Drop loop videos and attire stills into the personas folder, precompile them
    (or run `hotplate watch`), then render lip-synced MP4 from the store alone.
    """
    ctx.meta["hotplate.debug"] = debug
    try:
        ctx.obj = load_settings(config, personas=personas, cache=cache, models=models)
    except SettingsError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def main() -> None:
    cli(prog_name="hotplate")


def _register_daemon_commands() -> None:
    from hotplate.cli_watch import sync, watch  # light: heavy work happens in workers

    cli.add_command(watch)
    cli.add_command(sync)


def source_options(fn):
    """--persona/--attire/--motion/--video, shared by resolve and render."""
    options = [
        click.option("--persona", required=True, help="Persona folder name, e.g. ruby."),
        click.option(
            "--attire",
            default="default",
            show_default=True,
            help="Attire name; 'default' is the portrait.",
        ),
        click.option(
            "--motion", help="Motion loop name, e.g. M1 (default: first in sorted order)."
        ),
        click.option(
            "--video",
            type=click.Path(path_type=Path, dir_okay=False),
            help="Use this video instead of the personas folder.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@cli.command()
@source_options
@click.option(
    "--backend",
    type=click.Choice(["warp", "musetalk"]),
    help="Renderer whose recipe to resolve (musetalk implies upstream's) [default: settings'].",
)
@click.pass_context
def resolve(
    ctx: click.Context,
    persona: str,
    attire: str,
    motion: str | None,
    video: Path | None,
    backend: str | None,
) -> None:
    """Print the source file, its digest, the recipe, the avatar key and whether it is hot."""
    from pipeline.catalog import plan_for
    from pipeline.personas import resolve as resolve_source
    from pipeline.precompile.recipe import describe, for_backend

    settings = settings_of(ctx)
    found = resolve_source(settings.personas, persona, attire, motion, video)
    present = (settings.cache / "data.mdb").exists() or settings.cache.is_file()
    store = open_cache(settings) if present else None
    recipe = for_backend(settings.recipe, backend or settings.renderer).for_persona(found.options)
    p = plan_for(store, found.path, recipe)
    hot = store is not None and store.get_avatar(p.avatar) is not None
    click.echo(f"source   {found.path}  ({found.rule})")
    click.echo(f"recipe   {describe(recipe)}")
    click.echo(f"digest   {p.source_digest}")
    click.echo(f"avatar   {p.avatar}")
    click.echo(f"state    {'hot' if hot else 'cold'}")
    if not hot and store is not None:
        click.echo(f"why      {why_cold(store, p)}")


def why_cold(store, p) -> str:
    """Name the first stage that is missing, like dagster's stale causes."""
    for name, key in p.stages.items():
        if store.get_stage(key) is None:
            return (
                f"stage {name} is not in the store (new source, parameter or model from here down)"
            )
    return "every stage is present but the avatar manifest is not: a precompile will only link them"


def recipe_flags(fn):
    """Recipe options shared by precompile and render."""
    options = [
        click.option(
            "--max-frames", type=int, help="Frames to keep from a loop (0 = all) [default 250]."
        ),
        click.option(
            "--stride", type=int, help="Keyframe stride S: detect every S-th frame [default 4]."
        ),
        click.option(
            "--proxy", type=int, help="Longer side of the detection proxy in px [default 480]."
        ),
        click.option(
            "--bbox-shift",
            type=int,
            help="Move the half-face crop's top edge down by N px [default 0].",
        ),
        click.option(
            "--detector",
            type=click.Choice(DETECTORS),
            help="Face detector [default dlib; s3fd with --backend musetalk].",
        ),
        click.option(
            "--landmarks",
            type=click.Choice(LANDMARKERS),
            help="Landmark model [default dlib; dwpose with --backend musetalk].",
        ),
        click.option(
            "--mask",
            type=click.Choice(MASKERS),
            help="Blend mask source [default landmarks; bisenet with --backend musetalk].",
        ),
        click.option(
            "--parsing-mode",
            type=click.Choice(PARSING_MODES),
            help="BiSeNet mask mode, as upstream MuseTalk [default jaw; raw for MuseTalk v1.0].",
        ),
        click.option(
            "--crop-rules",
            type=click.Choice(CROP_RULES),
            help="Half-face box rules: hotplate's, or MuseTalk v1.5 / v1.0's "
            "[default hotplate; the UNet's version with --backend musetalk].",
        ),
        click.option(
            "--vae",
            help="VAE directory under the models dir for latents, e.g. sd-vae-ft-mse [default none].",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def recipe_from(settings: Settings, **given: object):
    changes = {k: v for k, v in given.items() if v is not None}
    recipe = settings.recipe.replace(**changes)
    recipe.check()
    return recipe


def persona_recipe(settings: Settings, path: Path, recipe, given: dict):
    """recipe with persona.toml applied when path lies in a persona's folder (as render and
    the watcher do), unless --bbox-shift was given."""
    from pipeline.catalog import recipe_for

    root = settings.personas.resolve()
    real = path.resolve()
    if (
        given.get("bbox_shift") is not None
        or not real.is_relative_to(root)
        or len(real.relative_to(root).parts) < 2
    ):
        return recipe
    return recipe_for(root, real.relative_to(root).parts[0], recipe)


def summary_table(report) -> None:
    from hotplate.output import human_bytes

    rows = [
        (s.name, "hit" if s.hit else "miss", f"{s.seconds:.2f} s", human_bytes(s.nbytes))
        for s in report.stages
    ]
    table(("stage", "cache", "time", "stored"), rows)
    c = report.counts
    click.echo(
        f"frames {c.get('frames', '?')}, keyframes detected {c.get('keyframes', '?')}, refined {c.get('refined', '?')}, "
        f"healed {c.get('healed', '?')}, detector runs {c.get('detections', '?')}"
    )
    click.echo(f"avatar {report.avatar}  ({'hot already' if report.hit else 'now hot'})")


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--force", is_flag=True, help="Recompute every stage even when it is in the store.")
@recipe_flags
@click.pass_context
def precompile(
    ctx: click.Context, paths: tuple[Path, ...], force: bool, **recipe_options: object
) -> None:
    """Precompile loop videos or stills into hot avatars (frames, track, landmarks,
    crops, masks, latents). A second run on the same file is a cache hit."""
    from hotplate.progress import StageBars
    from pipeline.precompile.run import precompile as run_precompile

    settings = settings_of(ctx)
    recipe = recipe_from(settings, **recipe_options)
    store = open_cache(settings)
    failed = 0
    for path in paths:
        bars = StageBars(prefix=f"{path.name} ")
        try:
            report = run_precompile(
                path,
                persona_recipe(settings, path, recipe, recipe_options),
                store,
                force=force,
                progress=bars,
            )
        except USER_ERRORS as exc:
            if ctx.meta.get("hotplate.debug") or len(paths) == 1:
                raise
            failed += 1
            click.echo(f"error: {exc}", err=True)
            continue
        finally:
            bars.close()
        click.echo(f"{path}")
        summary_table(report)
    if failed:
        raise click.ClickException(f"{failed} of {len(paths)} files failed")


@cli.command()
@source_options
@click.option(
    "--audio",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Speech: WAV, MP3, M4A, FLAC or OGG.",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Output MP4 path.",
)
@click.option(
    "--backend",
    type=click.Choice(["warp", "musetalk"]),
    help="Renderer [default warp, needs no weights].",
)
@click.option(
    "--loop",
    type=click.Choice(["pingpong", "cycle"]),
    help="Frame schedule over the stored loop [default pingpong].",
)
@click.option("--fps", type=float, help="Output frame rate [default: the loop's].")
@click.option(
    "--no-jit", is_flag=True, help="Fail on a cold avatar instead of precompiling it now."
)
@click.option(
    "--device", help="Where musetalk runs: cpu, cuda, cuda:1 [default: cuda when present]."
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    help="Frames per UNet call for musetalk [default 20, upstream's].",
)
@recipe_flags
@click.pass_context
def render(
    ctx: click.Context,
    persona: str,
    attire: str,
    motion: str | None,
    video: Path | None,
    audio: Path,
    output: Path,
    backend: str | None,
    loop: str | None,
    fps: float | None,
    no_jit: bool,
    device: str | None,
    batch_size: int | None,
    **recipe_options: object,
) -> None:
    """Render a lip-synced MP4 from hot assets; a cold avatar is precompiled first."""
    from hotplate.progress import StageBars
    from pipeline.render.job import LipSyncRequest, lip_sync

    settings = settings_of(ctx)
    backend = backend or settings.renderer
    recipe = recipe_from(settings, **recipe_options)
    request = LipSyncRequest(
        persona=persona,
        attire=attire,
        motion=motion,
        video=video,
        audio=audio,
        output=output,
        backend=backend,
        loop=loop,
        fps=fps,
        no_jit=no_jit,
        keep_bbox_shift=recipe_options.get("bbox_shift") is not None,
        device=device,
        batch_size=batch_size,
        explicit=frozenset(k for k, v in recipe_options.items() if v is not None),
    )
    bars = StageBars()
    try:
        outcome = lip_sync(
            open_cache(settings),
            settings.personas,
            recipe,
            request,
            models_dir=settings.models,
            default_loop=settings.loop,
            progress=bars,
        )
    finally:
        bars.close()
    result = outcome.render
    jit = f"JIT precompile {outcome.jit_seconds:.1f} s" if outcome.jit else "cache hit"
    click.echo(
        f"{jit}; first frame after {outcome.first_frame_seconds:.2f} s; {result.frames} frames "
        f"at {result.render_fps:.1f} fps; wrote {result.out_path}"
    )


@cli.command(name="ls")
@click.pass_context
def ls_cmd(ctx: click.Context) -> None:
    """List personas, attires and motions, hot or cold, with their size in the store."""
    from pipeline.catalog import iter_sources, plan_for, recipe_for

    settings = settings_of(ctx)
    present = (settings.cache / "data.mdb").exists() or settings.cache.is_file()
    store = open_cache(settings) if present else None
    rows = []
    for src in iter_sources(settings.personas):
        p = plan_for(store, src.path, recipe_for(settings.personas, src.persona, settings.recipe))
        avatar = store.get_avatar(p.avatar) if store else None
        size = sum(store.get_stage(k).nbytes for k in avatar["stages"].values()) if avatar else 0
        rows.append(
            (
                src.persona,
                src.attire,
                src.motion,
                src.kind,
                "hot" if avatar else "cold",
                human_bytes(size) if avatar else "-",
                src.path.name,
            )
        )
    if not rows:
        click.echo(f"no personas in {settings.personas}; see personas/README.md for the layout")
        return
    table(("persona", "attire", "motion", "kind", "state", "size", "file"), rows)


@cli.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """Store statistics and, when the watcher runs, daemon health."""
    from cachestore.stats import store_stats

    settings = settings_of(ctx)
    click.echo(f"store    {settings.cache}")
    if not (settings.cache / "data.mdb").exists() and not settings.cache.is_file():
        click.echo("         (empty: nothing precompiled yet)")
    else:
        stats = store_stats(open_cache(settings, readonly=True))
        click.echo(
            f"file     {human_bytes(stats.file_bytes)} on disk, map {human_bytes(stats.map_size)}"
        )
        table(
            ("db", "entries", "bytes"),
            [(db, stats.entries[db], human_bytes(stats.bytes[db])) for db in stats.entries],
        )
        counters = (
            ", ".join(
                f"{k} {human_bytes(v) if k.startswith('bytes') else v}"
                for k, v in sorted(stats.counters.items())
            )
            or "none"
        )
        click.echo(f"counters {counters}")
        if stats.last_gc:
            g = stats.last_gc
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(g["time"]))
            click.echo(
                f"last gc  {when}: deleted {g['deleted']} of {g['of']} entries, reclaimed {human_bytes(g['reclaimed'])}"
            )
    daemon_status(settings)


def daemon_status(settings: Settings) -> None:
    try:
        from watcher.health import describe
    except ImportError:  # the watcher is optional for status
        return
    for line in describe(settings.cache):
        click.echo(line)


@cli.command()
@click.option(
    "--grace",
    default=None,
    type=float,
    help="Keep anything used within this many hours [default 24].",
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
    from pipeline.catalog import iter_sources, plan_for, recipe_for

    settings = settings_of(ctx)
    # a dry run writes nothing: read-only store, --pin keys only count as roots
    store = open_cache(settings, readonly=dry_run)
    for key in pin if not dry_run else ():
        store.put("pin", key, {"time": time.time()})
    roots = set(pin)
    for src in iter_sources(settings.personas):
        try:
            roots.add(
                plan_for(
                    store, src.path, recipe_for(settings.personas, src.persona, settings.recipe)
                ).avatar
            )
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
    if text is None:
        return None
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * units[unit])
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a size; use e.g. 500M or 20G", param_hint="--max-size"
        ) from None


@cli.command()
@click.pass_context
def verify(ctx: click.Context) -> None:
    """Check every manifest's blobs exist and match their checksums; exit 1 on damage."""
    from cachestore.verify import verify as verify_store

    store = open_cache(settings_of(ctx), readonly=True)
    checked, problems = verify_store(store)
    for problem in problems:
        click.echo(str(problem))
    click.echo(f"checked {checked} manifests: {len(problems)} problems")
    if problems:
        sys.exit(1)


@cli.command()
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


_register_daemon_commands()

if __name__ == "__main__":
    main()
