"""Renderers: each makes the mouth region of a frame; `load_renderer` picks one by name.

The registry lives here, above the renderers, so that `base` (the protocol and the
blend every renderer uses) imports none of them.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.precompile.recipe import RENDERERS
from pipeline.render.renderers.base import Renderer


def load_renderer(
    name: str, models_dir: str | Path | None = None, device: str | None = None
) -> Renderer:
    """The renderer called `name`; ValueError for an unknown name."""
    if name == "warp":
        from pipeline.render.renderers.warp import WarpRenderer

        return WarpRenderer()
    if name == "musetalk":
        from pipeline.render.renderers.musetalk import MuseTalkRenderer

        return MuseTalkRenderer(models_dir, device=device)
    raise ValueError(f"renderer {name!r} is not one of {', '.join(RENDERERS)}")
