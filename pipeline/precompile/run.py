"""Precompile one source file into a hot avatar: the one entry point the watcher calls.

Steps, as ARCHITECTURE.md numbers them: 1. decode, 2. track, 3. landmarks, 4. crops,
5. masks, 6. latents (only with a VAE), and still (a talking loop's own mouth motion
taken out, unless the recipe says `still="off"`; docs/notebook/stilling.md). Each stage is looked up by its key first; a
hit does no work. Each stage's arrays and manifest land in one write transaction,
the avatar manifest last, so a failure at any point leaves no manifest that names
missing data.

`precompile(..., bank=True)` makes a talking clip's mouth bank hot instead: decode,
track, landmarks (shared with the clip's avatar, by key), then the bank stage, and a
record of its own in the avatar table (`"kind": "bank"`) naming only the bank stage,
so the clip's frames are not kept for it. `precompile_source` is what the watcher and
the CLI call for a file: a still's avatar; a loop's avatar and its bank, with or without
sound (empty, saying why, when it does not talk, so the question is asked once); a
`speech.mp4`'s bank. A render's just-in-time build makes the same avatar and bank
(`precompile_with_bank`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cachestore.errors import MissingStageError, StoreFullError, StoreNotWritableError
from cachestore.flight import DEFAULT_WAIT, Holder, single_flight
from cachestore.gc import discard_failed
from cachestore.hashcache import file_digest, snapshot
from cachestore.leases import Lease
from cachestore.remote.pull import pull_on_miss
from cachestore.remote.push import push_after_build
from cachestore.store import Store
from pipeline.frames import FrameSource
from pipeline.hot import hot_check
from pipeline.precompile.plan import Plan, plan
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.stages import Progress, StageResult, StageRunner
from pipeline.precompile.stages.bank import bank_stage
from pipeline.precompile.stages.decode import decode_snapshot
from pipeline.precompile.stages.latents import latents_stage
from pipeline.precompile.stages.per_frame import PerFrameStages
from pipeline.precompile.stages.still import still_stage
from pipeline.precompile.stages.track import track_stage

logger = logging.getLogger(__name__)


@dataclass
class PrecompileReport:
    source: Path
    digest: str
    avatar: str
    stages: list[StageResult] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=dict
    )  # frames, keyframes, refined, healed, detections
    damaged: list[str] = field(default_factory=list)  # stages found damaged and rebuilt
    pulled: float | None = None  # seconds, when it came from the blob tier (remote/pull.py)

    @property
    def hit(self) -> bool:
        return all(s.hit for s in self.stages)


def check_inputs(path: Path, recipe: Recipe) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if not path.is_file():
        raise ValueError(f"{path} is not a file; precompile takes a video or an image")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty (0 bytes); copy the file again")
    recipe.check()


def precompile(
    path: str | Path,
    recipe: Recipe,
    store: Store,
    force: bool = False,
    progress: Progress | None = None,
    flight_wait: float = DEFAULT_WAIT,
    on_wait: Callable[[str], None] | None = None,
    lease: Lease | None = None,
    bank: bool = False,
) -> PrecompileReport:
    """Make the avatar for `path` under `recipe` hot in `store` (`bank`: its mouth bank);
    returns what was done.

    On a miss, one process at a time builds an avatar (`cachestore/flight.py`): a second
    caller waits up to `flight_wait` seconds, tells on_wait whom it waits for, then
    reads the hit. The avatar key is leased before it is checked and the stage keys
    before the first is written, so gc keeps a build in progress; `lease` extends the
    caller's lease (a render keeps it for the avatar it then renders), else precompile
    holds its own until it returns. Raises MediaError (unreadable source), NoFaceError
    (no face anywhere), ModelMissingError (a configured backend's weights are absent),
    FlightTimeoutError and StoreError.
    """
    path = Path(path)
    progress = progress or (lambda stage, done, total: None)
    # 1. check inputs and plan every stage key
    check_inputs(path, recipe)
    digest = file_digest(store, path)
    keys = plan(digest, recipe, bank)
    report = PrecompileReport(path, digest, keys.avatar)
    with contextlib.ExitStack() as held:
        if lease is None and not store.readonly:  # a read-only store has no gc to fear
            lease = held.enter_context(Lease(store.path, []))
        if lease is not None:
            lease.extend([keys.avatar])
        if not force and _hit(store, keys, report):
            return report
        if store.readonly:
            raise StoreNotWritableError(
                f"precompile cannot write to the store at {store.path} (opened read-only); "
                f"run it as a user who can write there"
            )
        return _build_in_flight(
            path, recipe, store, keys, report, force, progress, lease, on_wait, flight_wait, bank
        )


def _build_in_flight(
    path: Path,
    recipe: Recipe,
    store: Store,
    keys: Plan,
    report: PrecompileReport,
    force: bool,
    progress: Progress,
    lease: Lease,
    on_wait: Callable[[str], None] | None,
    flight_wait: float,
    bank: bool = False,
) -> PrecompileReport:
    """Build under the flight lock of the avatar key that is built: when the snapshot
    shows the file changed since it was hashed, the lock moves to the new key (and a
    build of that key by another process is waited for, then read as a hit)."""
    tell = on_wait or logger.info

    def fly(key: str) -> contextlib.AbstractContextManager[bool]:
        return single_flight(
            store.path, key, flight_wait, lambda who: tell(_waiting_line(who, path))
        )

    # decode reads a private snapshot, hashed as it was copied: a file rewritten in place
    # from here on cannot put its new frames under the digest of its old bytes
    size, copied = path.stat().st_size, 0

    def on_bytes(n: int) -> None:
        nonlocal copied
        copied += n
        progress("snapshot", copied, size)

    with contextlib.ExitStack() as flight:
        flight.enter_context(fly(keys.avatar))
        # always look again: a holder that released just before we locked made it
        if not force and _hit(store, keys, report):
            return report
        lease.extend(keys.stages.values())  # gc keeps what this build writes
        # a bank's record names its bank stage alone: that is what a pull may write
        named = {"bank": keys.stages["bank"]} if bank else keys.stages
        if not force and (
            got := pull_on_miss(store, keys.avatar, named, tell, progress, flight_wait)
        ):
            if _hit(store, keys, report):  # another node built it: pulled, verified, hot
                report.pulled = got.seconds
                return report
        with snapshot(store, path, on_bytes) as (copy, snap_digest):
            if (
                snap_digest != keys.source_digest
            ):  # changed since it was hashed: build what was read
                keys = plan(snap_digest, recipe, bank)
                report = PrecompileReport(path, snap_digest, keys.avatar)
                lease.extend([keys.avatar, *keys.stages.values()])
                flight.close()  # the old key's lock: this build is of another key now
                flight.enter_context(fly(keys.avatar))
                if not force and _hit(store, keys, report):
                    return report
            store.count("misses")
            for attempt in range(2):
                try:
                    build = _build_bank if bank else _build
                    report = build(path, copy, recipe, store, keys, report, force, progress)
                    push_after_build(store, report.avatar, tell)  # never fails the build
                    return report
                except MissingStageError:
                    if attempt:  # a stage vanished twice in a row: give up loudly
                        raise
                    report.stages.clear()
                except BaseException:
                    # a failed precompile leaves no manifest of its own behind (a kill -9
                    # may: each is whole), and none that another build has leased
                    with contextlib.suppress(StoreFullError):  # on a full disk: left to gc
                        discard_failed(store, [s.key for s in report.stages if not s.hit], lease)
                    raise
    raise AssertionError("unreachable")


def _waiting_line(holder: Holder | None, path: Path) -> str:
    return f"{path.name}: waiting for {holder or 'another process'} to precompile it"


def _hit(store: Store, keys: Plan, report: PrecompileReport) -> bool:
    """True when the avatar is hot (`pipeline.hot.hot_check`, render's definition too); a
    damaged stage is named in report.damaged and rebuilt by the caller."""
    avatar, report.damaged = hot_check(store, keys.avatar)
    if avatar is None or report.damaged:
        return False
    records = {n: store.get_stage(k) for n, k in keys.stages.items()}
    report.stages = [
        StageResult(n, k, True, 0.0, records[n].nbytes if records[n] else 0)
        for n, k in keys.stages.items()
    ]
    report.counts = dict(avatar.get("counts", {}))
    if not store.readonly:
        store.count("hits")
        store.touch(keys.avatar)
    return True


def _first_stages(
    run: StageRunner,
    path: Path,
    copy: Path,
    recipe: Recipe,
    store: Store,
    progress: Progress,
    keep_crops: bool = True,
):
    """Steps 2-4, which an avatar and a mouth bank share: (decode, frames, track,
    per-frame stages, landmarks); `keep_crops`: make the crops in the landmarks pass."""
    # 2. decode: every frame, encoded with the frame codec, so renders never open the source
    decode = run.stage("decode", lambda: decode_snapshot(copy, path, recipe, progress))
    frames = FrameSource(
        store, decode.blobs, max(int(decode.meta["width"]), int(decode.meta["height"]))
    )
    # 3. track on proxies
    track = run.stage("track", lambda: track_stage(path, recipe, frames, progress))
    boxes = store.load_arrays(track.key)["boxes"]
    # 4. landmarks (with crops and masks after it, one pass over the full frames)
    per_frame = PerFrameStages(recipe, frames, boxes, progress, keep_crops=keep_crops)
    lm = run.stage("landmarks", per_frame.landmarks)
    return decode, frames, track, per_frame, lm


def _build(
    path: Path,
    copy: Path,
    recipe: Recipe,
    store: Store,
    keys: Plan,
    report: PrecompileReport,
    force: bool,
    progress: Progress,
) -> PrecompileReport:
    run = StageRunner(store, keys, report, force)
    decode, frames, track, per_frame, lm = _first_stages(run, path, copy, recipe, store, progress)
    n = int(decode.meta["frames"])
    crops = run.stage("crops", lambda: per_frame.crops(store.load_arrays(lm.key)["landmarks"]))
    run.stage(
        "masks",
        lambda: per_frame.masks(
            store.load_arrays(lm.key)["landmarks"],
            store.load_arrays(crops.key, ["crop_boxes"])["crop_boxes"],
        ),
    )
    if recipe.still != "off":  # the loop's own mouth motion out, before any mouth goes on
        run.stage(
            "still", lambda: still_stage(frames, store.load_arrays(lm.key)["landmarks"], progress)
        )
    if recipe.vae:
        run.stage(
            "latents",
            lambda: latents_stage(
                recipe, store.load_arrays(crops.key, ["crops"])["crops"], progress
            ),
        )
    report.counts = {"frames": n, **track.meta.get("counts", {})}
    # 7. the avatar manifest, last: it names every stage above
    store.put_avatar(
        keys.avatar,
        {
            "stages": keys.stages,
            "source_digest": keys.source_digest,
            "source": str(path),
            "frames": n,
            "fps": decode.meta["fps"],
            "width": decode.meta["width"],
            "height": decode.meta["height"],
            "counts": report.counts,
            "recipe": recipe.fields(),  # what `hotplate verify --repair` rebuilds it with
        },
    )
    return report


def _build_bank(
    path: Path,
    copy: Path,
    recipe: Recipe,
    store: Store,
    keys: Plan,
    report: PrecompileReport,
    force: bool,
    progress: Progress,
) -> PrecompileReport:
    run = StageRunner(store, keys, report, force)
    # 1-3. decode, track, landmarks: the same stages (by key) as the clip's avatar
    decode, frames, track, _, lm = _first_stages(
        run, path, copy, recipe, store, progress, keep_crops=False
    )
    n = int(decode.meta["frames"])
    # 4. the bank, from the frames, the landmarks and the snapshot's own audio, if any
    bank = run.stage(
        "bank",
        lambda: bank_stage(
            copy,
            frames,
            store.load_arrays(lm.key)["landmarks"],
            decode.meta["fps"],
            progress,
            str(path),
        ),
    )
    report.counts = {"frames": n, **track.meta.get("counts", {})}
    # 5. its record, naming only the bank (the frames above are the clip's, not its)
    store.put_avatar(
        keys.avatar,
        {
            "kind": "bank",
            "stages": {"bank": keys.stages["bank"]},
            "source_digest": keys.source_digest,
            "source": str(path),
            "frames": n,
            "fps": decode.meta["fps"],
            "width": decode.meta["width"],
            "height": decode.meta["height"],
            "entries": int(bank.meta.get("entries", 0)),
            "opening_range": bank.meta.get("opening_range"),
            "reason": bank.meta.get("reason", ""),
            "speech_share": bank.meta.get("speech_share", 0.0),
            "sound_late": bank.meta.get("sound_late", {}),
            "counts": report.counts,
            "recipe": recipe.fields(),
        },
    )
    return report


def precompile_source(
    path: str | Path, recipe: Recipe, store: Store, **options
) -> tuple[PrecompileReport, PrecompileReport | None]:
    """What a file in the personas folder needs hot: (the report whose key names the
    file's row: its avatar, or a speech clip's bank; the bank's report of a loop, or
    None). `options` are precompile's."""
    from pipeline.personas import is_speech
    from pipeline.precompile.recipe import for_speech

    path = Path(path)
    if is_speech(path):
        return precompile(path, for_speech(recipe), store, bank=True, **options), None
    return precompile_with_bank(path, recipe, store, **options)


def precompile_with_bank(
    path: str | Path, recipe: Recipe, store: Store, **options
) -> tuple[PrecompileReport, PrecompileReport | None]:
    """A file's avatar and, for a loop, its bank: (the avatar's report, the bank's or
    None for a still). A render's just-in-time build calls this for the file it renders,
    whatever its name. `options` are precompile's."""
    from pipeline.media import is_still

    path = Path(path)
    report = precompile(path, recipe, store, **options)
    if is_still(path):
        return report, None  # one picture: no footage of a mouth moving
    # any loop, filmed or rendered, with or without sound, is asked once whether it talks
    # (`bank.talks`): one that does is a bank of its own mouths; one that does not gets an
    # empty bank whose record says why, with the figure it was judged on (`resolve` shows
    # it). Its first stages are the avatar's, so the question costs the bank stage alone.
    return report, precompile(path, recipe, store, bank=True, **options)
