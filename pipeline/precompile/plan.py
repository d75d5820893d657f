"""The stage keys of a recipe, computed without running (or loading) anything.

Stage key = H(stage name, stage version, the recipe fields it reads, model identity,
upstream stage key). A stage's version is bumped when its code changes its output.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachestore.keys import avatar_key, stage_key
from pipeline.nets.backends import backend_identity
from pipeline.nets.cpu_speed import key_precision
from pipeline.precompile.recipe import Recipe

# stage -> (version, recipe fields it reads, upstream stage, backend kind whose identity it takes)
STAGES: dict[str, tuple[int, tuple[str, ...], str, str]] = {
    "decode": (1, ("max_frames",), "", ""),
    "track": (
        1,
        ("stride", "proxy", "refine_iou", "refine_shift", "face"),
        "decode",
        "detector",
    ),
    "landmarks": (1, (), "track", "landmarks"),
    "crops": (1, ("bbox_shift", "crop_size"), "landmarks", ""),
    "masks": (2, ("mask_feather",), "crops", "mask"),  # 2: hull has lips and jaw room
    "latents": (1, (), "crops", "vae"),
}
# the facemesh landmarks' own version (two-pass crop, the IBUG68 table, the mesh array);
# bumped when either changes what they store. The other backends keep version 1's keys.
MESH_VERSION = 1
BACKEND_FIELD = {"detector": "detector", "landmarks": "landmarks", "mask": "mask", "vae": "vae"}
# (backend kind, backend) -> the network pipeline/nets/cpu_speed.py runs for it
CPU_NETS = {("detector", "s3fd"): "s3fd", ("mask", "bisenet"): "bisenet"}


@dataclass(frozen=True)
class Plan:
    source_digest: str
    stages: dict[str, str]  # stage name -> stage key, in execution order
    avatar: str


def stage_names(recipe: Recipe) -> list[str]:
    return [s for s in STAGES if s != "latents" or recipe.vae]


def plan(source_digest: str, recipe: Recipe) -> Plan:
    """Every stage key for one source under one recipe.

    The decode stage's key also carries the frame codec, which changes what it stores.
    Raises ModelMissingError when a configured backend's weights are absent, since its
    identity cannot be known.
    """
    from pipeline.media import FRAME_CODEC  # light: media imports cv2/av inside functions

    keys: dict[str, str] = {}
    for name in stage_names(recipe):
        version, fields, upstream, kind = STAGES[name]
        params = {f: getattr(recipe, f) for f in fields}
        if name == "decode":
            params["frame_codec"] = FRAME_CODEC
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
