"""`hotplate watch` (the daemon) and `hotplate sync` (the same work, once, for cron/CI).

Only light modules are imported at the top: the daemon loop imports no model code,
and the workers it spawns import the pipeline themselves.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from hotplate.cli.common import FieldDefault
from hotplate.output import table
from hotplate.settings import Settings

# Tests inject a job function ("module:function") the workers run instead of precompile.
JOB_ENV = "HOTPLATE_WATCH_JOB"


def _settings(ctx: click.Context, personas: Path | None) -> Settings:
    settings = ctx.find_object(Settings)
    if personas is not None:
        settings.personas = personas
    return settings


def _config(settings: Settings, **options: object):
    from cachestore.remote.tier import attach
    from watcher.daemon import Config
    from watcher.worker import DEFAULT_JOB

    attach(
        settings.cache, settings.remote, settings.remote_key
    )  # the workers' misses pull, their builds push

    return Config(
        personas=settings.personas,
        cache=settings.cache,
        map_size=settings.map_size,
        flight_wait=settings.flight_wait,
        recipe=settings.recipe,
        job=os.environ.get(JOB_ENV) or DEFAULT_JOB,
        **options,
    )


personas_option = click.option(
    "--personas",
    type=click.Path(path_type=Path, file_okay=False),
    help="Personas folder (same as the group's --personas).",
)
workers_option = click.option(
    "--workers",
    type=click.IntRange(min=1),
    cls=FieldDefault,
    field="watcher.daemon:Config.workers",
    help="Worker processes; each loads the models once and keeps them.",
)
retry_options = [
    click.option(
        "--retries",
        type=click.IntRange(min=1),
        cls=FieldDefault,
        field="watcher.daemon:Config.retries",
        help="Attempts per file before it is reported failed (until it changes).",
    ),
    click.option(
        "--job-timeout",
        type=click.FloatRange(min=0),
        cls=FieldDefault,
        field="watcher.daemon:Config.job_timeout",
        help="Seconds before a precompile is killed and counted as a failure (0 = never).",
    ),
    click.option(
        "--backoff",
        type=click.FloatRange(min=0),
        cls=FieldDefault,
        field="watcher.daemon:Config.backoff",
        help="Seconds before the second attempt; doubles after each failure.",
    ),
]


def with_retry_options(fn):
    for option in reversed(retry_options):
        fn = option(fn)
    return fn


@click.command()
@personas_option
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    cls=FieldDefault,
    field="watcher.daemon:Config.settle",
    help="Seconds a file must be quiet (after it is closed, on Linux) before it is hashed.",
)
@click.option(
    "--rescan",
    type=click.FloatRange(min=0),
    cls=FieldDefault,
    field="watcher.daemon:Config.rescan",
    help="Minutes between full reconciles of the folder against the store (0 = at start only).",
)
@workers_option
@click.option("--polling", is_flag=True, help="Poll size and mtime instead of inotify events.")
@click.option("--json", "json_lines", is_flag=True, help="Log JSON lines instead of text.")
@with_retry_options
@click.pass_context
def watch(
    ctx: click.Context,
    personas: Path | None,
    settle: float,
    rescan: float,
    workers: int,
    polling: bool,
    json_lines: bool,
    retries: int,
    job_timeout: float,
    backoff: float,
) -> None:
    """Watch the personas folder and precompile what arrives, until SIGTERM or Ctrl-C.

    Files are hashed once they are closed and quiet; identical files precompile once;
    the folder is reconciled against the store at start and every --rescan minutes.
    One log line per decision on stdout. `hotplate status` shows the daemon's health.
    """
    from watcher.daemon import Daemon
    from watcher.log import Log

    settings = _settings(ctx, personas)
    config = _config(
        settings,
        settle=settle,
        rescan=rescan,
        workers=workers,
        polling=polling,
        retries=retries,
        backoff=backoff,
        job_timeout=job_timeout,
    )
    Daemon(config, log=Log(json_lines)).run()


class SyncProgress:
    """The sync's log: a tqdm bar over jobs on stderr (when it is a terminal), and
    failures printed as they happen."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=0, desc="sync", unit="file", file=sys.stderr, leave=False)
        if verbose:
            from watcher.log import Log

            self.lines = Log(stream=sys.stderr)

    def __call__(self, event: str, path: str = "", msg: str = "", **fields: object) -> None:
        if self.verbose:
            self.lines(event, path, msg, **fields)
        if self.bar is None:
            return
        if event == "queued" and "same_as" not in fields:  # a new job, not a file joining one
            self.bar.total += 1
            self.bar.refresh()
        elif event in ("job-done", "job-failed") and "job" in fields:
            self.bar.update(1)
        elif event == "job-start":
            self.bar.set_postfix_str(path, refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@click.command()
@personas_option
@workers_option
@click.option(
    "--retry-failed", is_flag=True, help="Also retry files that failed before though unchanged."
)
@click.option("-v", "--verbose", is_flag=True, help="Log every decision on stderr.")
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Fan out as Ray tasks on the cluster at ADDRESS ('auto': the local one); each "
    "pushes what it builds to the remote [needs hotplate[ray]].",
)
@with_retry_options
@click.pass_context
def sync(
    ctx: click.Context,
    ray_address: str | None,
    personas: Path | None,
    workers: int,
    retry_failed: bool,
    verbose: bool,
    retries: int,
    job_timeout: float,
    backoff: float,
) -> None:
    """Precompile everything outstanding in the personas folder once, then exit.

    For cron and CI: reconciles the folder against the store, precompiles what is new
    or changed with the daemon's worker pool (models load once per worker), prints
    what became hot, and exits 1 if anything failed.
    """
    from watcher.daemon import Daemon
    from watcher.health import SERVER_WATCH, holder

    settings = _settings(ctx, personas)
    if ray_address is not None:
        return _sync_on_ray(settings, ray_address)
    server = holder(settings.cache)
    if server is not None and server.get("what") == SERVER_WATCH:
        return _sync_through_server(settings, server)
    config = _config(
        settings,
        workers=workers,
        once=True,
        retry_failed=retry_failed,
        retries=retries,
        backoff=backoff,
        job_timeout=job_timeout,
        settle=1.0,
    )
    progress = SyncProgress(verbose)
    try:
        summary = Daemon(config, log=progress).run()
    finally:
        progress.close()
    _report(settings, summary.results, summary.failed_before, summary.unchanged)
    if summary.failed:
        sys.exit(1)


def _report(
    settings: Settings, results: dict[str, dict], failed_before: dict[str, str], unchanged: int
) -> None:
    """The table of what this sync saw through, its failures one line each, the summary
    line; exits 1 when anything failed."""
    rows = [
        (
            r["persona"],
            r["attire"],
            r["motion"],
            r["state"],
            "-" if r.get("seconds") is None else f"{r['seconds']:.1f} s",
            rel,
        )
        for rel, r in sorted(results.items())
    ]
    if rows:
        table(("persona", "attire", "motion", "state", "time", "file"), rows)
    failed = [(rel, r["error"]) for rel, r in sorted(results.items()) if r["state"] == "failed"]
    for rel, error in failed:
        click.echo(f"failed {rel}: {error}", err=True)
    for rel, error in sorted(failed_before.items()):
        click.echo(
            f"failed before, unchanged since (--retry-failed retries it) {rel}: {error}", err=True
        )
    hot = sum(r["state"] == "hot" for r in results.values())
    click.echo(
        f"{hot} became hot, {len(failed)} failed, {unchanged} already hot"
        + (f", {len(failed_before)} failed before" if failed_before else "")
        + f" in {settings.personas}"
    )
    if failed or failed_before:
        sys.exit(1)


def _sync_through_server(settings: Settings, server: dict) -> None:
    """A server watches this store (`hotplate serve --watch`): its queue builds what is
    outstanding (one queue, renders first); this waits until nothing is, then reports as
    a sync does. A file that failed there is a failure here."""
    from cachestore.store import open_store
    from watcher.health import holder_text, lock_held
    from watcher.keys import Keys
    from watcher.reconcile import wait_until_settled
    from watcher.sources import load_rows

    root = settings.personas.resolve()
    click.echo(
        f"{holder_text(server)} builds this folder through its queue (GET /v1/precompile "
        "shows it); waiting until nothing is outstanding",
        err=True,
    )
    store = open_store(settings.cache, map_size=settings.map_size)
    keys = Keys(root, settings.recipe)
    first, last = wait_until_settled(
        root,
        store,
        keys.avatar_of,
        alive=lambda: lock_held(settings.cache),
        tell=lambda n: click.echo(f"{n} file(s) outstanding", err=True),
    )
    rows = load_rows(store, root)
    waited = {o.rel for o in first.outstanding}
    results = {rel: rows[rel] for rel in waited if rel in rows}
    failed_before = {rel: rows[rel].get("error", "") for rel in first.failed if rel in rows}
    _report(settings, results, failed_before, len(set(last.hot) - waited))


def _sync_on_ray(settings: Settings, address: str) -> None:
    from pipeline.nets.backends import require_extra

    require_extra("ray", "hotplate sync --ray")
    from hotplate.cluster.sync import sync_on_ray

    if not settings.remote:
        click.echo("warning: no remote set: each node keeps what it builds to itself", err=True)
    results = sync_on_ray(settings, address, lambda line: click.echo(line, err=True))
    rows = [
        (r.persona, r.attire, r.motion, r.state, f"{r.seconds:.1f} s", r.node[:8], r.path)
        for r in sorted(results, key=lambda r: r.path)
    ]
    if rows:
        table(("persona", "attire", "motion", "state", "time", "node", "file"), rows)
    failed = [r for r in results if r.state == "failed"]
    for r in failed:
        click.echo(f"failed {r.path}: {r.error}", err=True)
    built = sum(r.state == "built" for r in results)
    pulled = sum(r.state == "pulled" for r in results)
    click.echo(
        f"{built} built, {pulled} pulled, {len(results) - built - pulled - len(failed)} "
        f"already hot, {len(failed)} failed on {address}"
    )
    if failed:
        sys.exit(1)
