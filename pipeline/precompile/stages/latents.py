"""Stage 6, latents: each crop through the VAE encoder (only with a VAE)."""

from __future__ import annotations

import numpy as np

from pipeline.nets.modelcache import kept
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.stages import Progress


def latents_stage(recipe: Recipe, crops: np.ndarray, progress: Progress):
    from pipeline.nets.vae import encode_latents, load_vae

    vae, _ = kept(
        "vae", recipe.vae, recipe.models_dir, lambda: load_vae(recipe.models_dir, recipe.vae)
    )
    out = np.zeros((len(crops), 8, 32, 32), np.float16)
    step = 8
    for i in range(0, len(crops), step):
        out[i : i + step] = encode_latents(vae, crops[i : i + step], batch=step)
        progress("latents", min(i + step, len(crops)), len(crops))
    return {"latents": out}, {}
