"""The stage keys of a recipe, computed without running (or loading) anything.

Stage key = H(stage name, stage version, the recipe fields it reads, model identity,
upstream stage key). A stage's version is bumped when its code changes its output.

A source has two plans: its avatar (decode .. masks, still, latents: what a render of it
reads; still unless the recipe says `still="off"`) and, for a video, its mouth bank (decode, track, landmarks, bank: `plan(..., bank=True)`),
whose own key names a record of its own. The two share their first three stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachestore.keys import avatar_key, stage_key
from pipeline.mouth.bank import VERSION as BANK_VERSION
from pipeline.nets.backends import backend_identity
from pipeline.nets.cpu_speed import key_precision
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.still import VERSION as STILL_VERSION

# stage -> (version, recipe fields it reads, upstream stage, backend kind whose identity it takes)
STAGES: dict[str, tuple[int, tuple[str, ...], str, str]] = {
    "decode": (2, ("max_frames",), "", ""),  # 2: frames as I420 JPEG (media.FRAME_CODEC)
    "track": (
        1,
        ("stride", "proxy", "refine_iou", "refine_shift", "face"),
        "decode",
        "detector",
    ),
    "landmarks": (1, (), "track", "landmarks"),
    "crops": (1, ("bbox_shift", "crop_size"), "landmarks", ""),
    "masks": (2, ("mask_feather",), "crops", "mask"),  # 2: hull has lips and jaw room
    "still": (STILL_VERSION, (), "landmarks", ""),  # a talking loop's own mouth taken out
    "latents": (1, (), "crops", "vae"),
    "bank": (BANK_VERSION, (), "landmarks", ""),  # the mouth bank of a talking clip
}
BANK_STAGES = ("decode", "track", "landmarks", "bank")
# the facemesh landmarks' own version (two-pass crop, the IBUG68 table, the mesh array);
# bumped when either changes what they store. The other backends keep version 1's keys.
MESH_VERSION = 1
BACKEND_FIELD = {"detector": "detector", "landmarks": "landmarks", "mask": "mask", "vae": "vae"}
# The decode stage's version for each frame codec: an older avatar's frames keep the
# version (and so the keys) they were built under, so it is still found and rendered.
DECODE_VERSIONS = {"i420-jpeg-q95": 2, "jpeg-q95-444": 1}
# (backend kind, backend) -> the network pipeline/nets/cpu_speed.py runs for it
CPU_NETS = {("detector", "s3fd"): "s3fd", ("mask", "bisenet"): "bisenet"}


@dataclass(frozen=True)
class Plan:
    source_digest: str
    stages: dict[str, str]  # stage name -> stage key, in execution order
    avatar: str


def stage_names(recipe: Recipe, bank: bool = False) -> list[str]:
    if bank:
        return list(BANK_STAGES)
    return [
        s
        for s in STAGES
        if s != "bank"
        and (s != "latents" or recipe.vae)
        and (s != "still" or recipe.still != "off")
    ]


def plan(
    source_digest: str, recipe: Recipe, bank: bool = False, frame_codec: str | None = None
) -> Plan:
    """Every stage key for one source under one recipe (`bank`: of its mouth bank).

    The decode stage's key also carries the frame codec (default: the one precompile
    writes, `media.FRAME_CODEC`; an older one names the keys an older avatar has), which
    changes what it stores and so every key below it. Raises ModelMissingError when a
    configured backend's weights are absent, since its identity cannot be known.
    """
    from pipeline.media import FRAME_CODEC  # light: media imports cv2/av inside functions

    frame_codec = frame_codec or FRAME_CODEC
    keys: dict[str, str] = {}
    for name in stage_names(recipe, bank):
        version, fields, upstream, kind = STAGES[name]
        params = {f: getattr(recipe, f) for f in fields}
        if name == "decode":
            version = DECODE_VERSIONS[frame_codec]
            params["frame_codec"] = frame_codec
        # fields added later count only off their old behaviour: existing keys stay valid
        if name == "crops" and recipe.crop_rules != "hotplate":
            params["crop_rules"] = recipe.crop_rules
        if name == "masks" and recipe.mask == "bisenet":
            params["parsing_mode"] = recipe.parsing_mode
        if name == "landmarks" and recipe.landmarks == "facemesh":
            params["mesh"] = MESH_VERSION  # the stage stores the mesh too
        model = ""
        if kind:
            backend = getattr(recipe, BACKEND_FIELD[kind])
            model = backend_identity(kind, backend, recipe.models_dir)
            net = "vae_encoder" if kind == "vae" and backend else CPU_NETS.get((kind, backend))
            if net and (precision := key_precision(net)):  # bf16 numbers get keys of their own
                params["cpu_runtime"] = precision
        keys[name] = stage_key(name, version, params, model, keys.get(upstream, source_digest))
    return Plan(source_digest, keys, avatar_key(source_digest, list(keys.values())))
