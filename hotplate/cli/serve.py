"""`hotplate serve`: the HTTP service and its page (hotplate/serve/).

Only click is imported at the top; FastAPI, uvicorn and the pipeline load when the
command runs, and the render workers import the models themselves.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import click

from hotplate.cli.common import FieldDefault, default_help
from hotplate.serve.config import TURN_ENV, ice_servers_problem, parse_turn_credentials
from hotplate.settings import Settings

TOKEN_ENV = "HOTPLATE_TOKEN"
ADMIN_TOKEN_ENV = "HOTPLATE_ADMIN_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Duration(click.ParamType):
    """24h, 30m, 90s, 500ms or plain seconds; 'off' where the option allows it."""

    name = "DURATION"

    def __init__(self, allow_off: bool = False) -> None:
        self.allow_off = allow_off

    def convert(self, value, param, ctx):
        from hotplate.serve.config import seconds

        try:
            parsed = seconds(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if parsed is None and not self.allow_off:
            self.fail(f"{value!r}: this option needs a duration, e.g. 60s", param, ctx)
        return str(value).strip()


DURATION = Duration()


class Workers(click.ParamType):
    """A count of workers, or 'auto'."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if str(value).strip().lower() == "auto":
            return "auto"
        try:
            n = int(value)
        except ValueError:
            self.fail(f"{value!r} is not a number of workers or 'auto'", param, ctx)
        if n < 1:
            self.fail(f"{n} workers: at least 1", param, ctx)
        return n


WORKERS = Workers()


def size_option(text: str | None, flag: str) -> int | None:
    from cachestore.space import parse_size

    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


SIGNING_KEY_MIN = 32  # characters: `openssl rand -hex 32` writes 64


def read_signing_key(path: Path) -> str:
    """The secret in a signing key file (its first line), or UsageError naming the fix."""
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise click.UsageError(
            f"cannot read the signing key file {path} ({exc.strerror})"
        ) from None
    if len(key) < SIGNING_KEY_MIN:
        raise click.UsageError(
            f"the signing key file {path} holds {len(key)} characters; put at least "
            f"{SIGNING_KEY_MIN} random ones there (openssl rand -hex 32 > {path})"
        )
    return key


def read_tokens(path: Path) -> tuple[str, ...]:
    """The tokens in a file, one per line (blank lines and # comments skipped)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def turn_credentials(path: Path | None) -> tuple[str, str] | None:
    """The TURN username and password: the file's, else TURN_ENV's, else None."""
    text, where = os.environ.get(TURN_ENV), TURN_ENV
    if path is not None:
        text, where = path.read_text(), str(path)
    if not text:
        return None
    try:
        return parse_turn_credentials(text, where)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8700,
    show_default=True,
    help="TCP port to listen on (0: any free port).",
)
@click.option(
    "--workers",
    type=WORKERS,
    cls=FieldDefault,
    field="hotplate.serve.config:ServeConfig.workers",
    help="Render worker processes; each loads the models once and keeps them. 'auto': "
    "from the usable cores and the renderer (warp: one per 2 cores; musetalk: 1).",
)
@click.option(
    "--queue-size",
    type=click.IntRange(min=1),
    cls=FieldDefault,
    field="hotplate.serve.config:ServeConfig.queue_size",
    help="Most renders (and streams) that may wait for a worker, whatever the estimates; "
    "beyond it 503.",
)
@click.option(
    "--max-queued-precompiles",
    type=click.IntRange(min=1),
    cls=FieldDefault,
    field="hotplate.serve.config:ServeConfig.max_queued_precompiles",
    help="Precompiles (POST /v1/precompile) queue as background work, however long the "
    "wait: up to this many avatars; beyond it 503 with Retry-After. A render always goes "
    "first.",
)
@click.option(
    "--watch",
    is_flag=True,
    help="Watch the personas folder as `hotplate watch` does, its precompiles queued "
    "with the API's (owner 'watcher' in GET /v1/precompile) on this server's workers: "
    "one queue, renders first. Instead of a separate `hotplate watch` on the same store.",
)
@click.option(
    "--max-wait",
    type=Duration(allow_off=True),
    envvar="HOTPLATE_MAX_WAIT",
    show_envvar=True,
    cls=FieldDefault,
    field="hotplate.serve.config:ServeConfig.max_wait",
    help="Admission: a request a worker is not expected to start within this (from the "
    "queue and measured service times) is refused at once, 503 with Retry-After (a live "
    "session: close code 1013). 'off': queue everything up to --queue-size.",
)
@click.option(
    "--max-per-client",
    type=click.IntRange(min=1),
    help="Workers one client (one token) may hold at once.  [default: all but one when "
    "there are several workers and several tokens; else all]",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(min=0),
    help="Conversation sessions (POST /v1/sessions) at once; each holds a worker for its "
    "life; beyond it 503 with Retry-After.  [default: as many as --workers]",
)
@click.option(
    "--max-sessions-per-client",
    type=click.IntRange(min=1),
    help="Conversation sessions one client (one token) may hold at once.  [default: as "
    "--max-per-client]",
)
@click.option(
    "--ice-address",
    multiple=True,
    metavar="ADDRESS",
    help="A local address conversation sessions offer as an ICE candidate; repeatable.  "
    "[default: 127.0.0.1 when --host is loopback, else every interface's]",
)
@click.option(
    "--ice-server",
    multiple=True,
    metavar="URL",
    help="A STUN or TURN server for conversation sessions' ICE (stun:host:port, "
    "turn:host:port[?transport=tcp], turns:host:port); repeatable. A TURN server's "
    f"username and password come from {TURN_ENV}=username:password or "
    "--turn-credentials-file.  [default: none is contacted]",
)
@click.option(
    "--turn-credentials-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A file whose first line is username:password, for the --ice-server turn: URLs "
    f"(kept out of the command line, which other users can read).  [default: {TURN_ENV}]",
)
@click.option(
    "--drain-timeout",
    type=DURATION,
    cls=FieldDefault,
    field="hotplate.serve.config:ServeConfig.drain_timeout",
    help="On SIGTERM: admit nothing more (503, /readyz not ready), let renders and streams "
    "in flight finish for up to this, then exit 0. A second SIGTERM, or SIGINT, stops at "
    "once (jobs recorded as interrupted, partial files removed).",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="File of bearer tokens, one per client and line, that every /v1 route and video "
    "needs; a job can be cancelled only with the token that made it."
    + default_help(f"env {TOKEN_ENV}"),
)
@click.option(
    "--admin-token-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="File holding a token that may also cancel or delete any job."
    + default_help(f"env {ADMIN_TOKEN_ENV}"),
)
@click.option(
    "--public-metrics",
    is_flag=True,
    help="Serve /metrics without a token (for a Prometheus that cannot send one).",
)
@click.option(
    "--allow-origin",
    multiple=True,
    metavar="URL",
    help="A web app origin (https://studio.example) whose pages may POST and DELETE; repeatable.",
)
@click.option(
    "--allowed-host",
    multiple=True,
    metavar="NAME",
    help="A name this server answers to besides loopback and --host (a reverse proxy's "
    "public name); repeatable, '*' for any.",
)
@click.option(
    "--signing-key-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="File holding the secret that signs the URLs of GET /v1/sign, so that servers "
    "sharing it (and restarts) accept each other's."
    + default_help(
        "setting signing_key_file; "
        "else a random key per server, shared by the replicas of one --ray deployment"
    ),
)
@click.option(
    "--max-upload-mb",
    type=click.FloatRange(min=0.001),
    cls=FieldDefault,
    field="hotplate.serve.config:ServeConfig.max_upload_bytes",
    scale=1e-6,
    help="Largest audio upload (413 above it).",
)
@click.option(
    "--max-audio-seconds",
    type=click.FloatRange(min=0.1),
    cls=FieldDefault,
    field="hotplate.serve.config:ServeConfig.max_audio_seconds",
    help="Longest audio clip (422 above it; checked before the clip is decoded whole).",
)
@click.option(
    "--keep-videos",
    type=DURATION,
    envvar="HOTPLATE_KEEP_VIDEOS",
    show_envvar=True,
    cls=FieldDefault,
    field="hotplate.serve.config:ServeConfig.keep_videos",
    help="How long a finished video stays on disk (24h, 30m, 90s); then it answers 410 "
    "and its record goes after as long again (404).",
)
@click.option(
    "--max-data-size",
    metavar="SIZE",
    help="Cap on the data dir (videos, uploads, records), e.g. 20G: past it the oldest "
    "videos are deleted first.  [default: no cap]",
)
@click.option(
    "--data",
    type=click.Path(path_type=Path, file_okay=False),
    help="Job records (jobs.sqlite) and videos  [default: <cache>-serve beside the store]",
)
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Deploy on the Ray cluster at ADDRESS as a Ray Serve app ('auto': the local "
    "one, started if none) [needs hotplate[ray]].",
)
@click.option("--replicas", type=click.IntRange(min=1), default=2, show_default=True,
              help="With --ray: replicas (each with --workers render workers).")  # fmt: skip
@click.option("--max-replicas", type=click.IntRange(min=1),
              help="With --ray: autoscale on queue depth up to this many.")  # fmt: skip
@click.option("--per-node", type=click.IntRange(min=1),
              help="With --ray: at most this many replicas on one node.")  # fmt: skip
@click.pass_context
def serve(
    ctx: click.Context,
    ray_address: str | None,
    replicas: int,
    max_replicas: int | None,
    per_node: int | None,
    host: str,
    port: int,
    workers: int | str,
    queue_size: int,
    max_queued_precompiles: int,
    watch: bool,
    max_wait: str,
    max_per_client: int | None,
    max_sessions: int | None,
    max_sessions_per_client: int | None,
    ice_address: tuple[str, ...],
    ice_server: tuple[str, ...],
    turn_credentials_file: Path | None,
    drain_timeout: str,
    token_file: Path | None,
    admin_token_file: Path | None,
    public_metrics: bool,
    allow_origin: tuple[str, ...],
    allowed_host: tuple[str, ...],
    signing_key_file: Path | None,
    max_upload_mb: float,
    max_audio_seconds: float,
    keep_videos: str,
    max_data_size: str | None,
    data: Path | None,
) -> None:
    """Serve lip-sync renders over HTTP, with a page for editors at /.

    POST /v1/lip-sync (multipart: persona, attire, motion, backend, audio) returns the
    MP4; /v1/renders queues jobs with progress as Server-Sent Events. OpenAPI at /docs.
    Listening beyond loopback needs a token (--token-file or HOTPLATE_TOKEN); with one,
    every /v1 route and video needs it, and /metrics unless --public-metrics.
    """
    token = os.environ.get(TOKEN_ENV) or None
    tokens = read_tokens(token_file) if token_file is not None else ()
    turn = turn_credentials(turn_credentials_file)
    problem = ice_servers_problem(ice_server, turn)
    if problem:
        raise click.UsageError(problem)
    admin = os.environ.get(ADMIN_TOKEN_ENV) or None
    if admin_token_file is not None:
        admin = next(iter(read_tokens(admin_token_file)), None)
    if not is_loopback(host) and not (token or tokens or admin):
        raise click.UsageError(
            f"--host {host} is reachable beyond this machine; set a token "
            f"({TOKEN_ENV} or --token-file) or listen on 127.0.0.1"
        )
    if "*" in allowed_host and not (token or tokens or admin):
        click.echo(
            "warning: --allowed-host '*' on a server without a token turns off the DNS "
            "rebinding guard: any web page the editor opens can reach this server through a "
            f"name it controls; set a token ({TOKEN_ENV} or --token-file) or name the hosts",
            err=True,
        )
    settings = ctx.find_object(Settings)
    if watch and ray_address is not None:
        raise click.UsageError(
            "--watch is for one server; on Ray, keep the fleet hot with `hotplate sync --ray`"
        )
    if watch:  # one line now, not a watcher thread that stops after the port opens
        from watcher.daemon import Config
        from watcher.health import Lock

        Config(settings.personas, settings.cache, settings.recipe).check()  # the folder
        probe = Lock(settings.cache)
        probe.acquire({"what": "hotplate serve --watch (starting)"}, what="hotplate serve --watch")
        probe.release()
    from pipeline.nets.backends import require_backend, require_extra

    require_backend("renderer", settings.renderer)  # a missing extra: one line, not a worker's
    if ray_address is not None:
        require_extra("ray", "hotplate serve --ray")
    signing_key_file = signing_key_file or (
        Path(settings.signing_key_file) if settings.signing_key_file else None
    )
    signing_key = read_signing_key(signing_key_file) if signing_key_file else None
    import logging

    # The guard's refusals and every problem's full detail, by request id (stderr).
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    serve_log = logging.getLogger("hotplate.serve")
    serve_log.addHandler(handler)
    serve_log.setLevel(logging.INFO)

    from cachestore.remote.tier import attach
    from hotplate.serve.app import ServeConfig, create_app

    attach(  # the render workers pull and push through it
        settings.cache, settings.remote, settings.remote_key
    )
    if workers == "auto":
        from hotplate.serve.config import auto_workers

        workers = auto_workers(settings.renderer)
    config = ServeConfig(
        settings=settings,
        workers=workers,
        queue_size=queue_size,
        max_queued_precompiles=max_queued_precompiles,
        watch=watch,
        max_wait=max_wait,
        max_per_client=max_per_client,
        max_sessions=max_sessions,
        max_sessions_per_client=max_sessions_per_client,
        ice_addresses=ice_address,
        ice_servers=ice_server,
        turn_credentials=turn,
        drain_timeout=drain_timeout,
        token=token,
        tokens=tokens,
        admin_token=admin,
        public_metrics=public_metrics,
        host=host,
        allowed_hosts=allowed_host,
        allow_origins=allow_origin,
        max_upload_bytes=int(max_upload_mb * 1e6),
        max_audio_seconds=max_audio_seconds,
        keep_videos=keep_videos,
        max_data_size=size_option(max_data_size, "--max-data-size"),
        data_dir=data,
        signing_key=signing_key,
    )
    if ray_address is not None:  # the same app and config, as replicas on a Ray cluster
        from dataclasses import fields

        from hotplate.cluster.serve import deploy, run_forever

        options = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "settings"}
        return run_forever(
            ray_address,
            lambda: deploy(
                settings, options, ray_address, replicas, host, port, max_replicas, per_node
            ),
            click.echo,
        )
    from hotplate.serve.records import claim_data_dir

    claim_data_dir(config.data)  # before the port: a second server refuses in one line
    click.echo(
        f"hotplate serve: http://{host}:{port}/ ({workers} worker(s), store {settings.cache}, "
        f"jobs in {config.data})"
    )
    from hotplate.serve.config import seconds
    from hotplate.serve.drain import run

    status = run(create_app(config), host, port, seconds(drain_timeout))
    if status:
        ctx.exit(status)
