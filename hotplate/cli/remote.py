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
    """The named files (persona "" unless the personas folder holds them), else the named
    personas' files, else every file of the personas folder, speech.mp4 included (its
    mouth bank is what a render of its persona reads)."""
    from pipeline.catalog import Source, iter_sources
    from pipeline.media import is_still
    from pipeline.personas import is_speech

    def kind(path: Path) -> str:
        return "still" if is_still(path) else "speech" if is_speech(path) else "loop"

    if paths:
        known = {s.path.resolve(): s for s in iter_sources(settings.personas)}
        return [known.get(p.resolve()) or Source("", "", "", p, kind(p)) for p in paths]
    found = [s for s in iter_sources(settings.personas) if not personas or s.persona in personas]
    missing = set(personas) - {s.persona for s in found}
    if missing:
        raise click.UsageError(
            f"no files for persona {', '.join(sorted(missing))} in {settings.personas}"
        )
    return found


def _reads(settings: Settings, store, sources):
    """Every record a render of the sources reads (`render_reads`), each once, under the
    recipe a render of each uses."""
    from pipeline.catalog import recipe_for, render_reads

    seen: set[str] = set()
    for src in sources:
        recipe = (
            recipe_for(settings.personas, src.persona, settings.recipe)
            if src.persona
            else settings.recipe
        )
        for read in render_reads(store, settings.personas, src, recipe):
            if read.key not in seen:
                seen.add(read.key)
                yield read


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@persona_option
@remote_option
@click.pass_context
def push(
    ctx: click.Context, paths: tuple[Path, ...], personas_named: tuple[str, ...], remote: str | None
) -> None:
    """Upload hot avatars, and the mouth banks their renders read, to the blob tier: blobs
    first, then manifests.

    With no PATHS and no --persona, every avatar and bank in the store."""
    from cachestore.hashcache import file_digest
    from cachestore.remote.push import push_avatar

    settings = settings_of(ctx)
    tier = _remote(settings, remote)
    store = open_cache(settings, fallback_readonly=True)
    records = dict(store.items("avatar"))
    if paths or personas_named:
        sources = _sources(settings, paths, personas_named)
        # what a render of them reads under the current recipe, and their avatars under
        # any other recipe this store holds
        wanted = {read.key for read in _reads(settings, store, sources)}
        digests = {file_digest(None, s.path) for s in sources if s.kind != "speech"}
        records = {
            k: r
            for k, r in records.items()
            if k in wanted or (r.get("kind") != "bank" and r.get("source_digest") in digests)
        }
    records = {k: r for k, r in records.items() if store.get_avatar(k) is not None}
    if not any(r.get("kind") != "bank" for r in records.values()):
        raise click.ClickException(f"nothing hot to push in {settings.cache}")
    sent = 0
    for key, record in sorted(records.items(), key=lambda kv: (kv[1].get("kind") == "bank", kv[0])):
        what = "mouth bank " if record.get("kind") == "bank" else ""
        bar = Bytes(f"push {key[:12]}")
        try:
            report = push_avatar(store, tier, key, bar)
        finally:
            bar.close()
        sent += report.bytes_sent
        click.echo(
            f"pushed {what}{key[:16]} ({Path(record.get('source', '?')).name}): {report.sent} "
            f"of {report.blobs} blobs sent, {human_bytes(report.bytes_sent)} in "
            f"{report.seconds:.2f} s"
        )
    banks = sum(r.get("kind") == "bank" for r in records.values())
    click.echo(
        f"{len(records) - banks} avatars on {tier.url} with {banks} mouth banks, "
        f"{human_bytes(sent)} sent"
    )


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@persona_option
@remote_option
@click.pass_context
def pull(
    ctx: click.Context, paths: tuple[Path, ...], personas_named: tuple[str, ...], remote: str | None
) -> None:
    """Download the avatars the personas folder needs (or the named files' or personas'),
    and the mouth banks their renders read, from the blob tier; what is hot here already is
    skipped. Exits 1 when an avatar was not on the tier or anything was refused as damaged
    (a bank the tier lacks is no failure: not every clip has one)."""
    from cachestore.remote.pull import pull_avatar
    from cachestore.remote.tier import RemoteDamagedError
    from pipeline.hot import why_not_hot

    settings = settings_of(ctx)
    tier = _remote(settings, remote)
    store = open_cache(settings)
    got = banks = hot = 0
    missing: list[str] = []
    for read in _reads(settings, store, _sources(settings, paths, personas_named)):
        if why_not_hot(store, read.key) is None:
            hot += read.kind == "avatar"
            continue
        what = f"{read.path}" if read.kind == "avatar" else f"{read.path} (mouth bank)"
        bar = Bytes(f"pull {read.path.name}")
        try:
            report = pull_avatar(store, tier, read.key, read.named, bar)
        except RemoteDamagedError as exc:
            click.echo(f"refused {what}: {exc}", err=True)
            missing.append(what)
            continue
        finally:
            bar.close()
        if report is None:
            if read.kind == "avatar":
                click.echo(f"not on the tier: {what} (avatar {read.key[:16]})", err=True)
                missing.append(what)
            continue
        got += read.kind == "avatar"
        banks += read.kind == "bank"
        click.echo(f"{what}: {report.line()}")
    click.echo(
        f"{got} pulled, {hot} hot already, {banks} mouth banks pulled, {len(missing)} not "
        f"pulled from {tier.url}"
    )
    if missing:
        sys.exit(1)


REMOTE_COMMANDS = (push, pull)
