"""Helpers every command module shares: the settings, the store, the source options.

A leaf module: the group (__init__.py), store.py and watch.py import it, it imports none of them.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Any

import click

from hotplate.settings import Settings


def invocation(personas: Path, cache: Path, *args: str) -> list[str]:
    """The argv that runs `hotplate --personas P --cache C ARGS...` in a fresh process with
    this interpreter (the demo, the tests and the benches start the CLI so)."""
    folders = ["--personas", str(personas), "--cache", str(cache)]
    return [sys.executable, "-m", "hotplate.cli", *folders, *args]


def settings_of(ctx: click.Context) -> Settings:
    return ctx.find_object(Settings)


def open_cache(settings: Settings, readonly: bool = False, fallback_readonly: bool = False):
    """The store; with fallback_readonly, a store this user cannot write opens read-only
    (a hot render, resolve and ls need no write access)."""
    from cachestore.errors import StoreNotWritableError
    from cachestore.remote.tier import attach
    from cachestore.store import open_store

    attach(
        settings.cache, settings.remote, settings.remote_key
    )  # misses pull from it, builds push to it

    # a cache path that is a file goes on to open_store, which names the problem
    if readonly and not settings.cache.is_file() and not (settings.cache / "data.mdb").exists():
        raise FileNotFoundError(
            f"no store at {settings.cache} yet; run `hotplate precompile` or `hotplate sync` first"
        )
    try:
        return open_store(settings.cache, readonly=readonly, map_size=settings.map_size)
    except StoreNotWritableError:
        if not fallback_readonly or not (settings.cache / "data.mdb").exists():
            raise
        return open_store(settings.cache, readonly=True, map_size=settings.map_size)


def source_options(fn):
    """--persona/--attire/--motion/--video, shared by resolve and render."""
    options = [
        click.option("--persona", required=True, help="Persona folder name, e.g. ruby."),
        click.option(
            "--attire",
            default="default",
            show_default=True,
            help="Attire name; 'default' is the portrait.",
        ),
        click.option(
            "--motion",
            help="Motion loop name, e.g. M1." + default_help("the first in sorted order"),
        ),
        click.option(
            "--video",
            type=click.Path(path_type=Path, dir_okay=False),
            help="Use this video instead of the personas folder.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def field_default(ref: str) -> Any:
    """The default of a dataclass field named "module:Class.field", or the value of a
    module's constant named "module:NAME"."""
    module, _, name = ref.partition(":")
    cls_name, _, field_name = name.partition(".")
    if not field_name:
        return getattr(importlib.import_module(module), cls_name)
    cls = getattr(importlib.import_module(module), cls_name)
    field = next(f for f in dataclasses.fields(cls) if f.name == field_name)
    if field.default is dataclasses.MISSING:
        raise TypeError(f"{ref} has no plain default")
    return field.default


class FieldDefault(click.Option):
    """An option whose default is a dataclass field's (`field="module:Class.field"`) or a
    module constant's (`field="module:NAME"`), times `scale` for a unit change, so the CLI
    never restates it. The module is imported only when this command's help or parsing
    needs the value, so other commands start fast."""

    def __init__(self, *args: Any, field: str, scale: float = 1.0, **kwargs: Any) -> None:
        kwargs.setdefault("show_default", True)
        self.field_ref, self.scale = field, scale
        super().__init__(*args, **kwargs)

    @property
    def default(self) -> Any:
        """The field's value, read when asked (click's `Parameter.default`, for callers)."""
        value = field_default(self.field_ref)
        return value * self.scale if self.scale != 1.0 else value

    @default.setter
    def default(self, value: Any) -> None:  # click sets it in __init__; the field holds it
        pass

    def get_default(self, ctx: click.Context, call: bool = True) -> Any:
        return self.default


def default_help(value: object, *more: str, env: str = "") -> str:
    """The help suffix for an option whose click default is None ("not given", so settings
    and persona.toml can apply), in click's own style: `  [env var: X; default: 250]`.
    `value` is read from the table that holds it (Recipe, SETTINGS), never restated."""
    items = ([f"env var: {env}"] if env else []) + [f"default: {value}", *more]
    return f"  [{'; '.join(items)}]"
