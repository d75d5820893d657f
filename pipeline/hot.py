"""Hot avatars: read an avatar's assets from the store, and nothing else.

`load_assets` returns frames that decode lazily, one read transaction each, so whoever
uses the assets holds `lease_avatar` around the load and the use: gc keeps a leased
avatar whatever its size cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cachestore.leases import Lease
from cachestore.store import Store
from pipeline.assets import AvatarAssets
from pipeline.frames import FrameSource, StilledFrames

# what a renderer reads; the 256x256 crops stay in the store
RENDER_ARRAYS = ["boxes", "landmarks", "mesh", "crop_boxes", "mask_boxes", "masks", "latents"]


class ColdAvatarError(LookupError):
    """The avatar (or a stage below it) is not in the store."""


@contextmanager
def lease_avatar(store: Store, avatar_key: str) -> Iterator[Lease | None]:
    """Lease the avatar for the `with` block; a read-only store takes no lease (nothing
    can write there, gc included) and yields None."""
    if store.readonly:
        yield None
        return
    with Lease(store.path, [avatar_key]) as lease:
        yield lease


def hot_check(store: Store, avatar_key: str) -> tuple[dict | None, list[str]]:
    """The one definition of hot, for render and precompile alike: (the avatar's manifest,
    or None when there is none; the names of its damaged stages). Hot is a manifest and
    nothing damaged. Every blob below the avatar is hashed whole against its digest (the
    hit path's integrity check, ~1% of a render's reads: bench/bench_integrity.py), so a
    damaged avatar reads as cold and is rebuilt; a blob this process hashed before and
    that LMDB has not moved since is not hashed again (`trust_unmoved`: a warm server's
    request pays a header check, not a hash of every frame).

    Listings (`hotplate ls`, the service's catalog) ask the same question of
    `Store.avatar_bytes`, one level shallower: every blob present with a whole header and
    size, not hashed (a listing of every source on every request cannot hash the store).
    A damaged blob this check finds is removed from the store, so from then on the
    listings see it too (docs/notebook/integrity.md, "One definition of hot")."""
    manifest = store.read_value("avatar", avatar_key)
    if manifest is None:
        return None, []
    damaged = store.damaged_stages(manifest["stages"], remove_damaged=True, trust_unmoved=True)
    return manifest, damaged


def why_not_hot(store: Store, avatar_key: str) -> str | None:
    """None when the avatar is hot (`hot_check`), else why not, as a phrase."""
    manifest, damaged = hot_check(store, avatar_key)
    if manifest is None:
        return "is cold under this recipe"
    if damaged:
        return f"is damaged in the store (stages {', '.join(damaged)})"
    return None


def load_assets(store: Store, avatar_key: str) -> AvatarAssets:
    """Every array a renderer needs; frames decode lazily from the store.

    Raises ColdAvatarError when the avatar or any blob below it is missing or damaged.
    """
    manifest = store.get_avatar(avatar_key)
    if manifest is None:
        raise ColdAvatarError(f"avatar {avatar_key} is not in the store")
    arrays = {}
    for stage in ("track", "landmarks", "crops", "masks", "latents"):
        key = manifest["stages"].get(stage)
        if key is None:
            continue
        loaded = store.load_arrays(key, RENDER_ARRAYS)
        if loaded is None:
            raise ColdAvatarError(f"stage {stage} of avatar {avatar_key} is missing or damaged")
        arrays.update(loaded)
    frames = store.get_stage(manifest["stages"]["decode"])
    if frames is None:
        raise ColdAvatarError(f"the frames of avatar {avatar_key} are missing")
    full_side = max(int(manifest["width"]), int(manifest["height"]))
    load_frame = FrameSource(store, frames.blobs, full_side)
    landmarks = arrays["landmarks"]
    still_key = manifest["stages"].get("still")  # a talking loop's mouth motion taken out
    if still_key is not None:
        still = store.get_stage(still_key)
        got = store.load_arrays(still_key, ["still_boxes", "still_landmarks"])
        if still is None or got is None:
            raise ColdAvatarError(f"stage still of avatar {avatar_key} is missing or damaged")
        if "still_landmarks" in got:  # some frame was stilled
            load_frame = StilledFrames(
                store, frames.blobs, full_side, still.blobs, got["still_boxes"]
            )
            landmarks = got["still_landmarks"]
    if not store.readonly:
        store.touch(avatar_key)
    return AvatarAssets(
        key=avatar_key,
        fps=float(manifest["fps"]),
        width=int(manifest["width"]),
        height=int(manifest["height"]),
        boxes=arrays["boxes"],
        landmarks=landmarks,
        crop_boxes=arrays["crop_boxes"],
        mask_boxes=arrays["mask_boxes"],
        masks=arrays["masks"],
        load_frame=load_frame,
        latents=arrays.get("latents"),
        mesh=arrays.get("mesh"),
    )


def load_bank(store: Store, bank_key: str):
    """The mouth bank (`pipeline.mouth.bank.MouthBank`) a bank record names, or None when
    it holds no mouths. Raises ColdAvatarError when it is missing or damaged."""
    from pipeline.mouth.bank import MouthBank

    manifest = store.get_avatar(bank_key)
    if manifest is None or manifest.get("kind") != "bank":
        raise ColdAvatarError(f"mouth bank {bank_key} is not in the store")
    stage = store.get_stage(manifest["stages"]["bank"])
    arrays = store.load_arrays(manifest["stages"]["bank"])
    if stage is None or arrays is None:
        raise ColdAvatarError(f"the mouth bank {bank_key} is missing or damaged")
    return MouthBank.from_arrays(bank_key, arrays, stage.meta)
