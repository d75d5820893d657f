"""The `hotplate` command: the group, precompile and render. Only light modules are
imported here so that resolve, status, ls and gc (in cli/store.py) start fast;
precompile and render import their stages lazily."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from hotplate.cli.common import (
    FieldDefault,
    default_help,
    open_cache,
    settings_of,
    source_options,
)
from hotplate.output import table
from hotplate.settings import SETTINGS, Settings, SettingsError, load_settings
from pipeline.precompile.recipe import (
    CROP_RULES,
    DETECTORS,
    LANDMARKERS,
    MASKERS,
    PARSING_MODES,
    STILL_MODES,
    Recipe,
)
from pipeline.render.profiles import FILE_PROFILE, PROFILES
from pipeline.render.renderers import RENDERERS

RECIPE = Recipe()  # the recipe flags' defaults, for their help
SETTING = {name: row[1]() for name, row in SETTINGS.items()}  # the settings' defaults, for help

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


@click.group(cls=HotplateGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--personas",
    type=click.Path(path_type=Path),
    help="Personas folder." + default_help(SETTING["personas"], env="HOTPLATE_PERSONAS"),
)
@click.option(
    "--cache",
    type=click.Path(path_type=Path),
    help="Store directory." + default_help(SETTING["cache"], env="HOTPLATE_CACHE"),
)
@click.option(
    "--models",
    type=click.Path(path_type=Path),
    help="Models directory for weights you provide."
    + default_help(SETTING["models"], env="HOTPLATE_MODELS"),
)
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Settings file." + default_help("./hotplate.toml if present", env="HOTPLATE_CONFIG"),
)
@click.option(
    "--flight-wait",
    type=float,
    help="Seconds to wait for another process precompiling the same avatar."
    + default_help(SETTING["flight_wait"], env="HOTPLATE_FLIGHT_WAIT"),
)
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(
    ctx: click.Context,
    personas: Path | None,
    cache: Path | None,
    models: Path | None,
    config: Path | None,
    flight_wait: float | None,
    debug: bool,
) -> None:
    """Keep talking-head avatar assets hot for real-time lip-sync.

    Drop loop videos and attire stills into the personas folder, precompile them
    (or run `hotplate watch`), then render lip-synced MP4 from the store alone.
    """
    ctx.meta["hotplate.debug"] = debug
    if debug:  # native libraries' own news (LiteRT's INFO lines) shown too, workers included
        os.environ["HOTPLATE_DEBUG"] = "1"
    try:
        ctx.obj = load_settings(
            config, personas=personas, cache=cache, models=models, flight_wait=flight_wait
        )
    except SettingsError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def main() -> None:
    cli(prog_name="hotplate")


def _register_commands() -> None:
    from hotplate.cli.remote import REMOTE_COMMANDS
    from hotplate.cli.serve import serve  # light: FastAPI and uvicorn load when it runs
    from hotplate.cli.store import STORE_COMMANDS
    from hotplate.cli.watch import sync, watch  # light: heavy work happens in workers

    for command in (*STORE_COMMANDS, *REMOTE_COMMANDS, watch, sync, serve):
        cli.add_command(command)


def recipe_flags(fn):
    """Recipe options shared by precompile and render."""
    options = [
        click.option(
            "--max-frames",
            type=int,
            help="Frames to keep from a loop (0 = all)." + default_help(RECIPE.max_frames),
        ),
        click.option(
            "--stride",
            type=int,
            help="Keyframe stride S: detect every S-th frame." + default_help(RECIPE.stride),
        ),
        click.option(
            "--proxy",
            type=int,
            help="Longer side of the detection proxy in px." + default_help(RECIPE.proxy),
        ),
        click.option(
            "--bbox-shift",
            type=int,
            help="Move the half-face crop's top edge down by N px (persona.toml's face hint "
            "still applies)." + default_help(f"persona.toml's, else {RECIPE.bbox_shift}"),
        ),
        click.option(
            "--detector",
            type=click.Choice(DETECTORS),
            help="Face detector." + default_help(RECIPE.detector, "s3fd with --backend musetalk"),
        ),
        click.option(
            "--landmarks",
            type=click.Choice(LANDMARKERS),
            help="Landmark model (facemesh: MediaPipe's face mesh; retinaface: 68 points "
            "fitted to RetinaFace's five, the fallback; dlib's and fan's are not for "
            "commercial use)." + default_help(RECIPE.landmarks, "dwpose with --backend musetalk"),
        ),
        click.option(
            "--mask",
            type=click.Choice(MASKERS),
            help="Blend mask source."
            + default_help(RECIPE.mask, "bisenet with --backend musetalk"),
        ),
        click.option(
            "--parsing-mode",
            type=click.Choice(PARSING_MODES),
            help="BiSeNet mask mode, as upstream MuseTalk."
            + default_help(RECIPE.parsing_mode, "raw for MuseTalk v1.0"),
        ),
        click.option(
            "--crop-rules",
            type=click.Choice(CROP_RULES),
            help="Half-face box rules: hotplate's, or MuseTalk v1.5 / v1.0's."
            + default_help(RECIPE.crop_rules, "the UNet's version with --backend musetalk"),
        ),
        click.option(
            "--vae",
            help="VAE directory under the models dir for latents, e.g. sd-vae."
            + default_help(RECIPE.vae or "none", "the models dir's with --backend musetalk"),
        ),
        click.option(
            "--still",
            type=click.Choice(STILL_MODES),
            help="auto: a loop shot while the presenter spoke gets its lips brought to rest "
            "before the new mouth goes on (a quiet loop and a still are left as they are); "
            "off: the loop's mouth as shot."
            + default_help(RECIPE.still, "off with --backend musetalk"),
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def check_recipe_flags(settings: Settings, **given: object) -> Recipe:
    """Raise ValueError for a bad recipe flag before any work; the recipe a request uses
    comes from `effective_recipe` once its source (persona.toml) is known."""
    from pipeline.precompile.recipe import effective_recipe

    return effective_recipe(settings.recipe, flags=given)


def recipe_for_path(settings: Settings, path: Path, given: dict) -> Recipe:
    """`effective_recipe` for a file given by path: persona.toml applies when the file lies
    in a persona's folder, as for render and the watcher (a --bbox-shift flag beats only
    the persona's shift)."""
    from pipeline.catalog import recipe_for
    from pipeline.precompile.recipe import effective_recipe

    root = settings.personas.resolve()
    real = path.resolve()
    if not real.is_relative_to(root) or len(real.relative_to(root).parts) < 2:
        return effective_recipe(settings.recipe, flags=given)
    return recipe_for(root, real.relative_to(root).parts[0], settings.recipe, flags=given)


# the recipe fields `hotplate precompile` takes as flags (see recipe_flags)
RECIPE_FLAGS = (
    "max_frames",
    "stride",
    "proxy",
    "bbox_shift",
    "detector",
    "landmarks",
    "mask",
    "parsing_mode",
    "crop_rules",
    "vae",
    "still",
)


def precompile_command(settings: Settings, path: Path, recipe) -> str:
    """A `hotplate precompile` command line that makes `recipe`'s avatar of `path` hot when
    pasted: the settings' folders as absolute paths, and a flag for each recipe field that
    precompile would otherwise choose differently (a backend's implied fields, flags)."""
    import shlex

    plain = recipe_for_path(settings, path, {})
    flags = {f: getattr(recipe, f) for f in RECIPE_FLAGS if getattr(recipe, f) != getattr(plain, f)}
    if recipe_for_path(settings, path, flags).fields() != recipe.fields():
        raise ValueError(f"no precompile flags give the recipe {recipe.fields()}")  # a bug
    words = ["hotplate"]
    for name, value in (
        ("--config", settings.config_file),
        ("--personas", settings.personas),
        ("--cache", settings.cache),
        ("--models", settings.models),
    ):
        if value is not None:
            words += [name, str(Path(value).absolute())]
    words += ["precompile", str(Path(path).absolute())]
    for name, value in flags.items():
        words += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(words)


def say(line: str) -> None:
    """A note for the user on stderr (e.g. whom a precompile waits for)."""
    click.echo(line, err=True)


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
    if report.damaged:
        click.echo(f"rebuilt damaged {', '.join(report.damaged)} (checksum or blob missing)")
    label = "mouth bank" if any(st.name == "bank" for st in report.stages) else "avatar"
    click.echo(f"{label} {report.avatar}  ({'hot already' if report.hit else 'now hot'})")


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--force", is_flag=True, help="Recompute every stage even when it is in the store.")
@recipe_flags
@click.pass_context
def precompile(
    ctx: click.Context, paths: tuple[Path, ...], force: bool, **recipe_options: object
) -> None:
    """Precompile loop videos or stills into hot avatars (frames, track, landmarks,
    crops, masks, still: a talking loop's lips brought to rest, latents), and a video's
    mouth bank (a loop that talks, or a persona's speech.mp4, which is only a bank). A
    second run on the same file is a cache hit."""
    from hotplate.progress import StageBars
    from pipeline.catalog import bank_info, describe_bank
    from pipeline.precompile.run import precompile_source

    settings = settings_of(ctx)
    check_recipe_flags(settings, **recipe_options)  # a bad flag fails before the store opens
    store = open_cache(settings)
    failed = 0
    for path in paths:
        bars = StageBars(prefix=f"{path.name} ")
        try:
            report, bank = precompile_source(
                path,
                recipe_for_path(settings, path, recipe_options),
                store,
                force=force,
                progress=bars,
                flight_wait=settings.flight_wait,
                on_wait=say,
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
        if bank is not None:
            click.echo(
                f"mouth bank {bank.avatar[:12]}: {describe_bank(bank_info(store, bank.avatar))}"
            )
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
    type=click.Choice(RENDERERS),
    help="Renderer (warp needs no weights)."
    + default_help(f"the settings' renderer, {SETTING['renderer']} unless set"),
)
@click.option(
    "--loop",
    type=click.Choice(["pingpong", "cycle"]),
    help="Frame schedule over the stored loop."
    + default_help(f"persona.toml's, else the settings', {SETTING['loop']} unless set"),
)
@click.option("--fps", type=float, help="Output frame rate." + default_help("the loop's"))
@click.option(
    "--profile",
    type=click.Choice(list(PROFILES)),
    default=FILE_PROFILE,
    show_default=True,
    help="Encoder profile: export (superfast, CRF 18, the delivered file) or preview "
    "(ultrafast, CRF 23, ~3x faster to encode, for a quick look).",
)
@click.option(
    "--no-jit", is_flag=True, help="Fail on a cold avatar instead of precompiling it now."
)
@click.option(
    "--device",
    help="Where musetalk runs: cpu, cuda, cuda:1." + default_help("cuda when present"),
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    cls=FieldDefault,
    field="pipeline.render.renderers.musetalk:BATCH_SIZE",
    help="Frames per UNet call for musetalk (upstream's default).",
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
    profile: str,
    no_jit: bool,
    device: str | None,
    batch_size: int | None,
    **recipe_options: object,
) -> None:
    """Render a lip-synced MP4 from hot assets; a cold avatar is precompiled first."""
    from hotplate.progress import StageBars
    from pipeline.lip_sync import LipSyncRequest, NotHotError, lip_sync
    from pipeline.nets.backends import require_backend

    settings = settings_of(ctx)
    backend = backend or settings.renderer
    require_backend("renderer", backend)  # a missing extra is one line, before any work
    check_recipe_flags(settings, **recipe_options)  # a bad flag fails before the store opens
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
        device=device,
        batch_size=batch_size,
        profile=profile,
        flags=recipe_options,
    )
    bars = StageBars()
    try:
        outcome = lip_sync(
            open_cache(settings, fallback_readonly=True),
            settings.personas,
            settings.recipe,
            request,
            default_loop=settings.loop,
            progress=bars,
            flight_wait=settings.flight_wait,
            on_wait=say,
        )
    except NotHotError as exc:  # the fix, as a command that works when pasted
        where = " as a user who can write the store" if exc.readonly else ""
        again = "" if exc.readonly else ", or drop --no-jit"
        command = precompile_command(settings, exc.source, exc.recipe)
        raise LookupError(f"{exc.what}; make it hot{where} with `{command}`{again}") from None
    finally:
        bars.close()
    result = outcome.render
    jit = f"JIT precompile {outcome.jit_seconds:.1f} s" if outcome.jit else "cache hit"
    click.echo(
        f"{jit}; first frame after {outcome.first_frame_seconds:.2f} s; {result.frames} frames "
        f"at {result.render_fps:.1f} fps ({result.profile} profile); wrote {result.out_path}"
    )


_register_commands()
