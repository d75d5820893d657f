"""Renderers: each makes the mouth region of a frame; `load_renderer` picks one by name.

The registry lives here, above the renderers, so that `base` (the protocol and the
blend every renderer uses) imports none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # base imports numpy: keep the names below cheap to import
    from pipeline.render.renderers.base import Renderer

RENDERERS = ("warp", "musetalk")  # the names load_renderer knows


def load_renderer(
    name: str,
    models_dir: str | Path | None = None,
    device: str | None = None,
    vae: str | None = None,
    batch_size: int | None = None,
) -> Renderer:
    """The renderer called `name`; ValueError for an unknown name, ExtraMissingError
    (pipeline.nets.backends) when its extra is not installed.

    `vae` names the VAE that encoded the avatar's latents (the recipe's): musetalk decodes
    with that same VAE. `device` and `batch_size` apply to renderers with a network.
    """
    if name == "warp":
        from pipeline.render.renderers.warp import WarpRenderer

        return WarpRenderer()
    if name == "musetalk":
        from pipeline.nets.backends import require_backend

        require_backend("renderer", name)  # one line naming `pip install 'hotplate[musetalk]'`
        from pipeline.render.renderers.musetalk import MuseTalkRenderer

        return MuseTalkRenderer(models_dir, device=device, batch_size=batch_size, vae=vae or None)
    raise ValueError(f"renderer {name!r} is not one of {', '.join(RENDERERS)}")
