"""`hotplate watch` and `hotplate sync` (placeholder until the watcher lands)."""

from __future__ import annotations

import click


@click.command()
def watch() -> None:
    """Watch the personas folder and precompile what arrives (not built yet)."""
    raise click.ClickException("the watcher is not built yet")


@click.command()
def sync() -> None:
    """Precompile everything outstanding in the personas folder once (not built yet)."""
    raise click.ClickException("sync is not built yet")
