"""`hotplate push` and `hotplate pull`: share hot avatars through the blob tier.

push sends what this store has hot (every avatar built from the named files, the named
personas' files, or the whole store); pull fetches what the personas folder needs under
the current recipe (or the named files' / personas' avatars) and is not hot here yet.
Both skip what is already on the other side and show a byte bar on a terminal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hotplate.cli.common import open_cache, settings_of
from hotplate.output import human_bytes
from hotplate.settings import Settings

remote_option = click.option(
    "--remote", help="Blob tier URL for this command [default: the remote setting]."
)
persona_option = click.option(
    "--persona", "personas_named", multiple=True, help="A persona's files (repeatable)."
)


class Bytes:
    """A `progress(done, total)` byte bar on stderr, only on a terminal."""

    def __init__(self, desc: str) -> None:
        self.desc, self.bar = desc, None

    def __call__(self, done: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(
                total=total, desc=self.desc, unit="B", unit_scale=True, leave=False, file=sys.stderr
            )
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _remote(settings: Settings, url: str | None):
    from cachestore.remote.tier import open_remote

    url = url or settings.remote
    if not url:
        raise click.UsageError("no blob tier: set remote (HOTPLATE_REMOTE) or pass --remote URL")
    return open_remote(url)


def _sources(settings: Settings, paths: tuple[Path, ...], personas: tuple[str, ...]):
    """(persona or None, path) for the named files, else the named personas' files, else
    every file of the personas folder. A persona's speech.mp4 is not one: it has no
    avatar, only a mouth bank, which push and pull do not carry (the watcher builds it)."""
    from pipeline.catalog import iter_sources

    if paths:
        return [(None, p) for p in paths]
    found = [
        (s.persona, s.path)
        for s in iter_sources(settings.personas)
        if (not personas or s.persona in personas) and s.kind != "speech"
    ]
    missing = set(personas) - {p for p, _ in found}
    if missing:
        raise click.UsageError(
            f"no files for persona {', '.join(sorted(missing))} in {settings.personas}"
        )
    return found


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@persona_option
@remote_option
@click.pass_context
def push(
    ctx: click.Context, paths: tuple[Path, ...], personas_named: tuple[str, ...], remote: str | None
) -> None:
    """Upload hot avatars to the blob tier: blobs first, then manifests.

    With no PATHS and no --persona, every avatar in the store."""
    from cachestore.hashcache import file_digest
    from cachestore.remote.push import push_avatar

    settings = settings_of(ctx)
    tier = _remote(settings, remote)
    store = open_cache(settings, fallback_readonly=True)
    # mouth banks stay out: a build pushes its own bank, and `pull` fetches avatars only
    avatars = {k: a for k, a in store.items("avatar") if a.get("kind") != "bank"}
    if paths or personas_named:
        digests = {file_digest(None, p) for _, p in _sources(settings, paths, personas_named)}
        avatars = {k: a for k, a in avatars.items() if a.get("source_digest") in digests}
    if not avatars:
        raise click.ClickException(f"nothing hot to push in {settings.cache}")
    sent = 0
    for key, record in sorted(avatars.items()):
        bar = Bytes(f"push {key[:12]}")
        try:
            report = push_avatar(store, tier, key, bar)
        finally:
            bar.close()
        sent += report.bytes_sent
        click.echo(
            f"pushed {key[:16]} ({Path(record.get('source', '?')).name}): {report.sent} of "
            f"{report.blobs} blobs sent, {human_bytes(report.bytes_sent)} in {report.seconds:.2f} s"
        )
    click.echo(f"{len(avatars)} avatars on {tier.url}, {human_bytes(sent)} sent")


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@persona_option
@remote_option
@click.pass_context
def pull(
    ctx: click.Context, paths: tuple[Path, ...], personas_named: tuple[str, ...], remote: str | None
) -> None:
    """Download the avatars the personas folder needs (or the named files' or personas')
    from the blob tier; what is hot here already is skipped. Exits 1 when some were not
    on the tier or were refused as damaged."""
    from cachestore.remote.pull import pull_avatar
    from cachestore.remote.tier import RemoteDamagedError
    from pipeline.catalog import plan_for, recipe_for
    from pipeline.hot import why_not_hot

    settings = settings_of(ctx)
    tier = _remote(settings, remote)
    store = open_cache(settings)
    got = hot = 0
    missing: list[str] = []
    for persona, path in _sources(settings, paths, personas_named):
        recipe = (
            settings.recipe
            if persona is None
            else recipe_for(settings.personas, persona, settings.recipe)
        )
        planned = plan_for(store, path, recipe)
        key = planned.avatar
        if why_not_hot(store, key) is None:
            hot += 1
            continue
        bar = Bytes(f"pull {path.name}")
        try:
            report = pull_avatar(store, tier, key, planned.stages, bar)
        except RemoteDamagedError as exc:
            click.echo(f"refused {path}: {exc}", err=True)
            missing.append(str(path))
            continue
        finally:
            bar.close()
        if report is None:
            click.echo(f"not on the tier: {path} (avatar {key[:16]})", err=True)
            missing.append(str(path))
            continue
        got += 1
        click.echo(f"{path}: {report.line()}")
    click.echo(f"{got} pulled, {hot} hot already, {len(missing)} not pulled from {tier.url}")
    if missing:
        sys.exit(1)


REMOTE_COMMANDS = (push, pull)
