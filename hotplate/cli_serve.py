"""`hotplate serve`: the HTTP service and its page (hotplate/serve/).

Only click is imported at the top; FastAPI, uvicorn and the pipeline load when the
command runs, and the render workers import the models themselves.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import click

from hotplate.settings import Settings

TOKEN_ENV = "HOTPLATE_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8700, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Render worker processes; each loads the models once and keeps them.",
)
@click.option(
    "--queue-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Jobs that may wait for a worker; beyond it requests get 429 with Retry-After.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help=f"File holding the bearer token POST and DELETE need [or env {TOKEN_ENV}].",
)
@click.option(
    "--max-upload-mb",
    type=click.FloatRange(min=0.001),
    default=50.0,
    show_default=True,
    help="Largest audio upload (413 above it).",
)
@click.option(
    "--max-audio-seconds",
    type=click.FloatRange(min=0.1),
    default=300.0,
    show_default=True,
    help="Longest audio clip (422 above it).",
)
@click.option(
    "--retention-hours",
    type=click.FloatRange(min=0),
    default=24.0,
    show_default=True,
    help="Hours a finished render's video is kept; its record stays, marked expired.",
)
@click.option(
    "--data",
    type=click.Path(path_type=Path, file_okay=False),
    help="Job records (jobs.sqlite) and videos [default: <cache>-serve beside the store].",
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
    workers: int,
    queue_size: int,
    token_file: Path | None,
    max_upload_mb: float,
    max_audio_seconds: float,
    retention_hours: float,
    data: Path | None,
) -> None:
    """Serve lip-sync renders over HTTP, with a page for editors at /.

    POST /v1/lip-sync (multipart: persona, attire, motion, backend, audio) returns the
    MP4; /v1/renders queues jobs with progress as Server-Sent Events. OpenAPI at /docs.
    Listening beyond loopback needs a token (--token-file or HOTPLATE_TOKEN).
    """
    token = os.environ.get(TOKEN_ENV) or None
    if token_file is not None:
        token = token_file.read_text().strip() or None
    if not is_loopback(host) and token is None:
        raise click.UsageError(
            f"--host {host} is reachable beyond this machine; set a token "
            f"({TOKEN_ENV} or --token-file) or listen on 127.0.0.1"
        )
    import uvicorn

    from cachestore.remote import attach
    from hotplate.serve.app import ServeConfig, create_app

    settings = ctx.find_object(Settings)
    attach(settings.cache, settings.remote)  # the render workers pull and push through it
    config = ServeConfig(
        settings=settings,
        workers=workers,
        queue_size=queue_size,
        token=token,
        max_upload_bytes=int(max_upload_mb * 1e6),
        max_audio_seconds=max_audio_seconds,
        retention_hours=retention_hours,
        data_dir=data,
    )
    if ray_address is not None:  # the same app and config, as replicas on a Ray cluster
        from dataclasses import fields

        from hotplate.ray_serve import deploy, run_forever

        options = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "settings"}
        url = deploy(settings, options, ray_address, replicas, host, port, max_replicas, per_node)
        return run_forever(url, click.echo)
    click.echo(
        f"hotplate serve: http://{host}:{port}/ ({workers} worker(s), store {settings.cache}, "
        f"jobs in {config.data})"
    )
    uvicorn.run(create_app(config), host=host, port=port, log_level="info", access_log=False)
