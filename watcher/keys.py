"""The daemon's memo of recipes (per persona, while persona.toml is unchanged) and avatar
keys (per content and recipe), so a scan keys each file once."""

from __future__ import annotations

import os
from typing import Any

from pipeline.catalog import Source
from pipeline.personas import read_options
from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe


class Keys:
    # -- recipes and keys -------------------------------------------------------------

    def _recipe_for(self, persona: str) -> Recipe:
        """The settings' recipe with persona.toml's bbox_shift, as `hotplate render` uses."""
        toml = self.root / persona / "persona.toml"
        try:
            st = os.stat(toml)
            key: Any = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        cached = self._recipes.get(persona)
        if cached is not None and cached[0] == key:
            return cached[1]
        options = read_options(self.root, persona) if key is not None else {}
        recipe = self.c.recipe.for_persona(options, str(toml))
        self._recipes[persona] = (key, recipe)
        return recipe

    def _avatar(self, digest: str, recipe: Recipe) -> str:
        key = (digest, recipe)
        if key not in self._avatars:
            self._avatars[key] = plan(digest, recipe).avatar
        return self._avatars[key]

    def _avatar_of(self, src: Source, digest: str) -> str:
        return self._avatar(digest, self._recipe_for(src.persona))
