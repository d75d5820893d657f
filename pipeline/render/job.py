"""One lip-sync request, start to finish: the entry point the CLI, the watcher and the
HTTP service share.

Steps: 1. resolve the names and check everything that costs no work (audio, output
path, weights); 2. lease the avatar, then hot, or precompile just in time (one process
at a time per avatar; the lease grows to the avatar precompile builds, when the file
changed since it was planned); 3. render from the store alone, under the lease, so a
concurrent gc cannot take the avatar away mid-render. Front ends only turn their own input into a
`LipSyncRequest` and report the outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cachestore.flight import DEFAULT_WAIT
from cachestore.store import Store
from pipeline.precompile.recipe import Recipe
from pipeline.render.video import RenderReport

# progress(step, done, total): step is "jit <stage>" during a JIT precompile, else "render"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class LipSyncRequest:
    persona: str
    attire: str
    audio: Path
    output: Path
    motion: str | None = None
    video: Path | None = None  # an explicit source file instead of the names
    backend: str = "warp"
    loop: str | None = None  # None: persona.toml's, else `default_loop`
    fps: float | None = None  # None: persona.toml's, else the renderer's or the loop's
    no_jit: bool = False
    keep_bbox_shift: bool = False  # an explicit --bbox-shift beats persona.toml
    device: str | None = None  # "cpu", "cuda", "cuda:1"; None = CUDA when there is one
    batch_size: int | None = None  # frames per renderer call; None = the renderer's
    # recipe fields the caller chose (flags): the backend's implied recipe keeps them
    explicit: frozenset[str] = frozenset()


@dataclass
class LipSyncOutcome:
    avatar: str
    source: Path
    jit: bool  # the avatar was cold and was precompiled for this request
    jit_seconds: float
    render: RenderReport
    first_frame_seconds: float  # from the call until the first frame was encoded


def check_audio(audio: Path) -> None:
    if not audio.is_file() or audio.stat().st_size == 0:
        raise ValueError(
            f"audio {audio} is missing or empty; pass a WAV, MP3, M4A, FLAC or OGG file"
        )


def lip_sync(
    store: Store,
    personas: Path,
    recipe: Recipe,
    request: LipSyncRequest,
    models_dir: Path | None = None,
    default_loop: str = "pingpong",
    progress: Progress | None = None,
    flight_wait: float = DEFAULT_WAIT,
    on_wait: Callable[[str], None] | None = None,
) -> LipSyncOutcome:
    """Render `request` from hot assets, precompiling its avatar first when it is cold.

    Raises PersonaError (unknown names, listing what exists), ValueError (bad audio or
    output path), ModelMissingError (weights), LookupError (cold with no_jit, or cold
    in a read-only store) and whatever precompile and render raise.
    """
    from pipeline.catalog import plan_for
    from pipeline.hot import lease_avatar, load_assets, why_not_hot
    from pipeline.personas import resolve as resolve_source
    from pipeline.precompile.recipe import for_backend
    from pipeline.precompile.run import precompile
    from pipeline.render.video import check_output, render_video

    started = time.perf_counter()
    progress = progress or (lambda step, done, total: None)
    # 1. check everything that needs no work: names, audio, output path, weights
    found = resolve_source(personas, request.persona, request.attire, request.motion, request.video)
    check_audio(request.audio)
    check_output(request.output)
    if recipe.models_dir is None and models_dir is not None:
        recipe = recipe.replace(models_dir=Path(models_dir))
    recipe = for_backend(recipe, request.backend, request.explicit)
    if request.backend == "musetalk":
        from pipeline.render.renderers.musetalk import check_weights

        check_weights(models_dir, recipe.vae or None)
    options = found.options
    if not request.keep_bbox_shift:
        recipe = recipe.for_persona(options, f"{found.persona}/persona.toml")

    # 2. lease the avatar (gc keeps it from here on), then hot or just in time
    planned = plan_for(store, found.path, recipe)
    with lease_avatar(store, planned.avatar) as lease:
        avatar, jit, jit_seconds = planned.avatar, False, 0.0
        if (why := why_not_hot(store, planned.avatar)) is not None:
            if request.no_jit or store.readonly:
                fix = "the store is read-only here" if store.readonly else "--no-jit was given"
                raise LookupError(
                    f"avatar {planned.avatar[:12]} of {found.path.name} {why} and {fix}; "
                    f"make it hot with `hotplate precompile {found.path}`"
                    + ("" if store.readonly else " (or drop --no-jit)")
                )
            jit_start = time.perf_counter()
            report = precompile(
                found.path,
                recipe,
                store,
                progress=lambda stage, done, total: progress(f"jit {stage}", done, total),
                flight_wait=flight_wait,
                on_wait=on_wait,
                lease=lease,  # a changed file's new avatar is leased before it is built
            )
            avatar, jit, jit_seconds = report.avatar, True, time.perf_counter() - jit_start
        elif not store.readonly:
            store.count("hits")

        # 3. render from the store alone
        assets = load_assets(store, avatar)
        render_called = time.perf_counter()
        result = render_video(
            assets,
            request.audio,
            request.output,
            backend=request.backend,
            loop=request.loop or options.get("loop") or default_loop,
            fps=request.fps or options.get("fps"),
            models_dir=models_dir,
            progress=lambda done, total: progress("render", done, total),
            device=request.device,
            vae=recipe.vae or None,
            batch_size=request.batch_size,
        )
    return LipSyncOutcome(
        avatar=avatar,
        source=found.path,
        jit=jit,
        jit_seconds=jit_seconds,
        render=result,
        first_frame_seconds=render_called - started + result.first_frame_seconds,
    )
