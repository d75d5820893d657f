"""One lip-sync request, start to finish: the entry point the CLI, the watcher and the
HTTP service share.

`live_lip_sync` is the same request with its audio arriving as it is spoken: both take
steps 1-2 through `hot_avatar`. Steps: 1. resolve the names and check everything that costs no work (audio, output
path, weights); 2. lease the avatar, then hot, or precompile just in time (one process
at a time per avatar; the lease grows to the avatar precompile builds, when the file
changed since it was planned); 3. render from the store alone, under the lease, so a
concurrent gc cannot take the avatar away mid-render. Front ends only turn their own input into a
`LipSyncRequest` and report the outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cachestore.codec import CodecError
from cachestore.flight import DEFAULT_WAIT
from cachestore.store import Store
from pipeline.precompile.recipe import Recipe
from pipeline.render.live import LiveReport
from pipeline.render.video import FragmentSink, RenderReport

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
    device: str | None = None  # "cpu", "cuda", "cuda:1"; None = CUDA when there is one
    batch_size: int | None = None  # frames per renderer call; None = the renderer's
    # encoder profile (render/profiles.py); None = "export" for a file, "preview" streamed
    profile: str | None = None
    # recipe fields the caller gave (flags; None = not given), for effective_recipe
    flags: dict[str, object] = field(default_factory=dict)


class StoreDamagedError(RuntimeError):
    """The store's copy of an avatar is damaged even after a rebuild: the server's fault,
    never the request's (a 500, not a 4xx)."""


class NotHotError(LookupError):
    """The avatar is cold (or damaged) and may not be built here: --no-jit, or a read-only
    store. Carries what a front end needs to print a fix that works when pasted."""

    def __init__(self, what: str, avatar: str, source: Path, recipe: Recipe, readonly: bool):
        fix = "" if readonly else " (or drop --no-jit)"
        super().__init__(
            f"{what}; precompile {source} under the same recipe where the store is writable{fix}"
        )
        self.what = what  # the message without its fix: a front end adds its own
        self.avatar, self.source, self.recipe, self.readonly = avatar, source, recipe, readonly


@dataclass
class LipSyncOutcome:
    avatar: str
    source: Path
    jit: bool  # the avatar was cold and was precompiled for this request
    jit_seconds: float
    render: RenderReport
    first_frame_seconds: float  # from the call until the first frame was encoded
    bank: str | None = None  # the mouth bank the mouths came from (warp), if any


def check_audio(audio: Path) -> None:
    if not audio.is_file() or audio.stat().st_size == 0:
        raise ValueError(
            f"audio {audio} is missing or empty; pass a WAV, MP3, M4A, FLAC or OGG file"
        )


@dataclass
class HotAvatar:
    """What steps 1-2 hand to the render: the leased, hot avatar and how it was made."""

    avatar: str
    source: Path
    recipe: Recipe  # the effective recipe (its models_dir and vae drive the renderer)
    options: dict  # persona.toml's (loop, fps)
    jit: bool
    jit_seconds: float
    bank: str | None = None  # the persona's hot mouth bank (warp only), leased with the avatar

    def assets(self, store: Store):
        """The avatar's assets for the render, the persona's mouth bank with them."""
        from pipeline.hot import load_assets, load_bank

        assets = load_assets(store, self.avatar)
        if self.bank is not None:
            assets.bank = load_bank(store, self.bank)
        return assets


@contextmanager
def hot_avatar(
    store: Store,
    personas: Path,
    recipe: Recipe,
    request: LipSyncRequest,
    progress: Progress,
    flight_wait: float = DEFAULT_WAIT,
    on_wait: Callable[[str], None] | None = None,
    on_jit: Callable[[], None] | None = None,
    check: Callable[[], None] = lambda: None,
) -> Iterator[HotAvatar]:
    """Steps 1-2 of every lip-sync, whole file or live: resolve the names, `check` what
    else costs no work, apply the recipe rule and check weights; then lease the avatar
    and make it hot (just in time on a miss). The `with` body renders under the lease."""
    from pipeline.catalog import plan_for
    from pipeline.hot import lease_avatar, why_not_hot
    from pipeline.personas import resolve as resolve_source
    from pipeline.precompile.recipe import effective_recipe
    from pipeline.precompile.run import precompile_with_bank

    # 1. check everything that needs no work: names, the caller's checks, weights
    found = resolve_source(personas, request.persona, request.attire, request.motion, request.video)
    check()
    options = found.options
    source = f"{found.persona}/persona.toml"
    recipe = effective_recipe(recipe, options, request.backend, request.flags, source)
    if request.backend == "musetalk":
        from pipeline.nets.backends import require_backend
        from pipeline.render.renderers.musetalk import check_weights

        require_backend("renderer", "musetalk")  # its extra before its weights
        check_weights(recipe.models_dir, recipe.vae or None)

    # 2. lease the avatar (gc keeps it from here on), then hot or just in time
    planned = plan_for(store, found.path, recipe)
    with lease_avatar(store, planned.avatar) as lease:
        avatar, jit, jit_seconds, pulled = planned.avatar, False, 0.0, False
        if (why := why_not_hot(store, planned.avatar)) is not None:
            if request.no_jit or store.readonly:
                fix = "the store is read-only here" if store.readonly else "--no-jit was given"
                raise NotHotError(
                    f"avatar {planned.avatar[:12]} of {found.path.name} {why} and {fix}",
                    planned.avatar,
                    found.path,
                    recipe,
                    store.readonly,
                )
            if on_jit is not None:  # a typed signal: front ends need not parse step names
                on_jit()
            jit_start = time.perf_counter()
            # the avatar and, for a loop, its bank (its own mouths, or an empty one that
            # says why it does not talk), as `precompile` and the watcher build them
            report, _ = precompile_with_bank(
                found.path,
                recipe,
                store,
                progress=lambda stage, done, total: progress(f"jit {stage}", done, total),
                flight_wait=flight_wait,
                on_wait=on_wait,
                lease=lease,  # a changed file's new avatar is leased before it is built
            )
            avatar, jit, jit_seconds = report.avatar, True, time.perf_counter() - jit_start
            pulled = report.pulled is not None
        elif not store.readonly:
            store.count("hits")
        bank = None
        if request.backend == "warp":  # its mouths from the presenter's footage, when hot
            from pipeline.catalog import persona_bank

            pull = None
            if pulled:  # it came from the tier, and so may the banks its source's render read
                from cachestore.remote.pull import pull_on_miss

                def pull(read) -> None:
                    if lease is not None:
                        lease.extend([read.key])  # gc keeps what the pull writes
                    pull_on_miss(
                        store,
                        read.key,
                        read.named,
                        on_wait,
                        lambda stage, done, total: progress(f"jit {stage}", done, total),
                        flight_wait,
                    )

            got = persona_bank(store, personas, found.persona, recipe, found.path, pull)
            if got is not None:
                bank = got[0]
                if lease is not None:
                    lease.extend([bank])
        yield HotAvatar(avatar, found.path, recipe, options, jit, jit_seconds, bank)


def lip_sync(
    store: Store,
    personas: Path,
    recipe: Recipe,
    request: LipSyncRequest,
    default_loop: str = "pingpong",
    progress: Progress | None = None,
    flight_wait: float = DEFAULT_WAIT,
    on_wait: Callable[[str], None] | None = None,
    on_jit: Callable[[], None] | None = None,
) -> LipSyncOutcome:
    """Render `request` from hot assets, precompiling its avatar first when it is cold.

    `recipe` is the settings' recipe (it carries models_dir); the request's backend,
    flags and the persona's persona.toml are applied by `effective_recipe`, as every
    front end applies them. Raises PersonaError (unknown names, listing what exists),
    ValueError (bad audio, output path or flag), ModelMissingError (weights), NotHotError
    (cold with no_jit, or cold in a read-only store) and whatever precompile and render
    raise.
    """
    from pipeline.render.video import check_output

    started = time.perf_counter()
    progress = progress or (lambda step, done, total: None)

    def check() -> None:
        check_audio(request.audio)
        check_output(request.output)

    for last in (False, True):
        try:
            hot, render_called, result = _render_hot(
                store,
                personas,
                recipe,
                request,
                progress,
                flight_wait,
                on_wait,
                on_jit,
                check,
                default_loop,
            )
            break
        except CodecError as damage:
            # a blob the hit check passed is damaged (Reader.array forgot its spot): once
            # more, and the hit check hashes it, removes it and the avatar is rebuilt
            if last:
                raise StoreDamagedError(
                    f"the store's copy of {request.persona}/{request.attire} is damaged "
                    f"and rebuilding it did not help ({damage}); run `hotplate verify --repair`"
                ) from damage
    return LipSyncOutcome(
        avatar=hot.avatar,
        source=hot.source,
        jit=hot.jit,
        jit_seconds=hot.jit_seconds,
        render=result,
        first_frame_seconds=render_called - started + result.first_frame_seconds,
        bank=hot.bank,
    )


def _render_hot(
    store: Store,
    personas: Path,
    recipe: Recipe,
    request: LipSyncRequest,
    progress: Progress,
    flight_wait: float,
    on_wait: Callable[[str], None] | None,
    on_jit: Callable[[], None] | None,
    check: Callable[[], None],
    default_loop: str,
):
    """Steps 1-3 once: (the hot avatar, when its render was called, the render's result)."""
    from pipeline.render.video import render_video

    steps = hot_avatar(
        store, personas, recipe, request, progress, flight_wait, on_wait, on_jit, check
    )
    with steps as hot:
        # 3. render from the store alone
        assets = hot.assets(store)
        render_called = time.perf_counter()
        result = render_video(
            assets,
            request.audio,
            request.output,
            backend=request.backend,
            loop=request.loop or hot.options.get("loop") or default_loop,
            fps=request.fps or hot.options.get("fps"),
            models_dir=hot.recipe.models_dir,
            progress=lambda done, total: progress("render", done, total),
            device=request.device,
            vae=hot.recipe.vae or None,
            batch_size=request.batch_size,
            profile=request.profile,
        )
    return hot, render_called, result


def live_lip_sync(
    store: Store,
    personas: Path,
    recipe: Recipe,
    request: LipSyncRequest,
    chunks: Iterable[bytes],
    rate: int,
    channels: int,
    sink: FragmentSink,
    default_loop: str = "pingpong",
    progress: Progress | None = None,
    flight_wait: float = DEFAULT_WAIT,
    on_jit: Callable[[], None] | None = None,
) -> LiveReport:
    """Steps 1-2 as `lip_sync` takes them, then `live_render`: audio that arrives as it
    is spoken (`chunks` of s16le PCM) in, fragmented MP4 segments to `sink` out.
    `request.audio` and `request.output` are not read (the sink is the output)."""
    from pipeline.render.live import live_render

    progress = progress or (lambda step, done, total: None)
    steps = hot_avatar(store, personas, recipe, request, progress, flight_wait, on_jit=on_jit)
    with steps as hot:
        # 3. render the input as it comes, from the store alone
        out = live_render(
            hot.assets(store),
            chunks,
            rate,
            channels,
            sink,
            backend=request.backend,
            loop=request.loop or hot.options.get("loop") or default_loop,
            fps=request.fps or hot.options.get("fps"),
            models_dir=hot.recipe.models_dir,
            device=request.device,
            vae=hot.recipe.vae or None,
            progress=progress,
            profile=request.profile,
        )
    out.avatar, out.jit, out.jit_seconds = hot.avatar, hot.jit, hot.jit_seconds
    return out
