"""Helpers every command module shares: the settings, the store, the source options.

A leaf module: cli.py, cli_store.py and cli_watch.py import it, it imports none of them.
"""

from __future__ import annotations

from pathlib import Path

import click

from hotplate.settings import Settings


def settings_of(ctx: click.Context) -> Settings:
    return ctx.find_object(Settings)


def open_cache(settings: Settings, readonly: bool = False, fallback_readonly: bool = False):
    """The store; with fallback_readonly, a store this user cannot write opens read-only
    (a hot render, resolve and ls need no write access)."""
    from cachestore.errors import StoreNotWritableError
    from cachestore.remote import attach
    from cachestore.store import open_store

    attach(settings.cache, settings.remote)  # misses pull from it, builds push to it

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
            "--motion", help="Motion loop name, e.g. M1 (default: first in sorted order)."
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
