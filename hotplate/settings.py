"""Settings: defaults, then hotplate.toml, then HOTPLATE_* variables, then flags.

Each setting is one row of SETTINGS, so a new one is a new row, not a new branch.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cachestore.space import parse_size
from pipeline.precompile.recipe import Recipe, effective_recipe


class Size(int):
    """Bytes, written as 1048576, 64M or 8G (binary units)."""

    def __new__(cls, value: Any) -> Size:
        return super().__new__(cls, parse_size(value))


Size.__name__ = "size"  # what a bad value is said not to be


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback) / "hotplate"


# name -> (type, default factory, help)
SETTINGS: dict[str, tuple[type, Any, str]] = {
    "personas": (Path, lambda: Path("personas"), "the personas folder"),
    "cache": (Path, lambda: _xdg("XDG_CACHE_HOME", ".cache") / "store", "the LMDB store directory"),
    "models": (
        Path,
        lambda: _xdg("XDG_DATA_HOME", ".local/share") / "models",
        "the models directory",
    ),
    "renderer": (str, lambda: "warp", "render backend: warp or musetalk"),
    "loop": (str, lambda: "pingpong", "frame schedule: pingpong or cycle"),
    "grace_hours": (float, lambda: 24.0, "gc keeps anything used within this many hours"),
    "flight_wait": (
        float,
        lambda: 900.0,
        "seconds a precompile waits for another process building the same avatar",
    ),
    "map_size": (Size, lambda: Size("8G"), "initial LMDB map size (64M, 8G); it grows by itself"),
    "remote": (
        str,
        lambda: "",
        "blob tier shared by stores: http(s)://host/prefix or s3://bucket/prefix (empty: none)",
    ),
    "remote_key": (
        str,
        lambda: "",
        "key signing the tier's manifests (HMAC-SHA256), or @FILE holding it; pulls then "
        "refuse manifests it did not sign (empty: none)",
    ),
    "signing_key_file": (
        str,
        lambda: "",
        "file holding the secret that signs the server's URLs (GET /v1/sign); servers with "
        "the same file accept each other's (empty: a random key per server, shared by the "
        "replicas of one `serve --ray`)",
    ),
}
RECIPE_FIELDS = {f.name for f in fields(Recipe) if f.compare}  # not models_dir, explicit


@dataclass
class Settings:
    personas: Path
    cache: Path
    models: Path
    renderer: str
    loop: str
    grace_hours: float
    flight_wait: float
    map_size: int
    remote: str = ""
    remote_key: str = ""
    signing_key_file: str = ""
    recipe: Recipe = field(default_factory=Recipe)
    config_file: Path | None = None
    # the settings a flag, a variable or the file gave (recipe fields: `recipe.explicit`)
    explicit: frozenset[str] = frozenset()


class SettingsError(ValueError):
    """A config file or variable that cannot be used as given."""


def _convert(name: str, kind: type, value: Any, origin: str) -> Any:
    try:
        if kind is Path:
            return Path(os.path.expanduser(str(value)))
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{origin}: {name}={value!r} is not a {kind.__name__}") from exc


def load_settings(config: Path | None = None, **flags: Any) -> Settings:
    """Merge every source; raises SettingsError naming the file or variable at fault."""
    config = config or (
        Path(os.environ["HOTPLATE_CONFIG"]) if "HOTPLATE_CONFIG" in os.environ else None
    )
    config = config or (Path("hotplate.toml") if Path("hotplate.toml").is_file() else None)
    file_values: dict[str, Any] = {}
    if config is not None:
        try:
            file_values = tomllib.loads(Path(config).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(
                f"{config}: cannot read settings ({exc}); fix the file or remove it"
            ) from exc
    recipe_values = dict(file_values.pop("recipe", {}))
    unknown = set(file_values) - set(SETTINGS)
    if unknown:
        raise SettingsError(
            f"{config}: unknown settings {', '.join(sorted(unknown))}; known: {', '.join(SETTINGS)}"
        )

    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for name, (kind, default, _) in SETTINGS.items():
        env = f"HOTPLATE_{name.upper()}"
        if flags.get(name) is not None:
            values[name] = _convert(name, kind, flags[name], f"--{name}")
        elif env in os.environ:
            values[name] = _convert(name, kind, os.environ[env], env)
        elif name in file_values:
            values[name] = _convert(name, kind, file_values[name], str(config))
        else:
            values[name] = default()
            continue
        explicit.add(name)

    recipe_types = {f.name: f.type for f in fields(Recipe)}
    for name in RECIPE_FIELDS:
        env = f"HOTPLATE_{name.upper()}"
        if env in os.environ:
            recipe_values[name] = os.environ[env]
    bad = set(recipe_values) - RECIPE_FIELDS
    if bad:
        raise SettingsError(
            f"{config}: unknown [recipe] keys {', '.join(sorted(bad))}; known: {', '.join(sorted(RECIPE_FIELDS))}"
        )
    kinds = {"int": int, "float": float, "str": str}
    typed = {
        k: _convert(k, kinds[str(recipe_types[k])], v, f"recipe.{k}")
        for k, v in recipe_values.items()
    }
    # a field set here stays as set, even to its default value (Recipe.explicit)
    recipe = Recipe(models_dir=values["models"], explicit=frozenset(typed)).replace(**typed)
    # renderer = "musetalk" implies upstream's recipe everywhere (watcher, ls, gc, render)
    try:
        recipe = effective_recipe(recipe, backend=values["renderer"])
    except ValueError as exc:
        raise SettingsError(f"recipe: {exc}") from exc
    return Settings(**values, recipe=recipe, config_file=config, explicit=frozenset(explicit))
