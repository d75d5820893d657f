"""The daemon's memo of recipes (per persona, while persona.toml is unchanged) and avatar
keys (per content and recipe), so a scan keys each file once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.catalog import Source
from pipeline.personas import read_options
from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe, effective_recipe, for_speech


class Keys:
    """Recipe and avatar key of each source, as `hotplate render` computes them."""

    def __init__(self, root: Path, recipe: Recipe) -> None:
        self.root = root
        self.recipe = recipe  # the settings' recipe
        self._recipes: dict[str, tuple[Any, Recipe]] = {}
        self._avatars: dict[tuple[str, Recipe, bool], str] = {}

    def recipe_for(self, persona: str) -> Recipe:
        """`effective_recipe` of the settings' recipe (its renderer's implied already) and
        persona.toml, as `hotplate render` computes it; memoized on persona.toml's stat."""
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
        recipe = effective_recipe(self.recipe, options, source=str(toml))
        self._recipes[persona] = (key, recipe)
        return recipe

    def avatar(self, digest: str, recipe: Recipe, kind: str = "loop") -> str:
        """The key a source's row tracks: its avatar; a speech clip's, its mouth bank."""
        key = (digest, recipe, kind == "speech")
        if key not in self._avatars:
            self._avatars[key] = (
                plan(digest, for_speech(recipe), bank=True)
                if kind == "speech"
                else plan(digest, recipe)
            ).avatar
        return self._avatars[key]

    def avatar_of(self, src: Source, digest: str) -> str:
        return self.avatar(digest, self.recipe_for(src.persona), src.kind)

    def forget(self, persona: str) -> None:
        """persona.toml changed: read it again next time."""
        self._recipes.pop(persona, None)

    def new_scan(self) -> None:
        """Models may have changed: compute identities again, once per scan."""
        self._avatars.clear()
