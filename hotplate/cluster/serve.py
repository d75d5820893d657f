"""`hotplate serve --ray`: the same FastAPI app (`create_app(ServeConfig)`) as a Ray Serve
ingress, one app per replica, each with its render workers and models kept loaded.

- Settings reach the replicas through Ray's runtime_env: every `HOTPLATE_*` setting and
  recipe field, resolved on the driver (flags, hotplate.toml, environment).
- Each node's replicas share that node's store at the configured cache path; a node whose
  disks differ (or several nodes on one machine, as in the tests) sets
  `HOTPLATE_NODE_CACHE` in the environment its `ray start` runs in, which beats the cache
  setting there. A node that lacks an avatar pulls it from the blob tier (`remote`).
- Routing by avatar: Serve's model multiplexing with the avatar's names as the model id.
  A client that sends `serve_multiplexed_model_id: persona/attire[/motion]` gets a
  replica that has served that avatar (it is hot in that node's store and its frames in
  that node's page cache); without the header Serve spreads by queue length.
- Single flight across the cluster: `cachestore/remote/ray_flight.py` (a named actor), used by
  every replica's render workers through `HOTPLATE_RAY_ADDRESS`.
- Each response names the Ray node that served it (`x-hotplate-node`), for tests and
  for an operator reading logs.

- The job API and conversation sessions work whichever replica answers: job and
  session ids name their replica, and a replica forwards another's requests there
  (`hotplate/cluster/peers.py`, the speech WebSocket too); the replicas share one
  signing key, so a URL any of them signed opens on all.

Routes, auth and limits are the app's own. `/readyz` answers 200 only when the whole
deployment can answer: every replica wanted is up and registered, reachable, with one
signing key (`hotplate/cluster/readiness.py`); a replica registers before its start
finishes, and Serve sends traffic only to replicas whose start finished. A replica
being stopped (SIGTERM to `hotplate serve --ray`, a redeploy, a downscale) drains through
Serve's graceful shutdown: no new requests, the ongoing ones finish, then the app's
lifespan waits for its queued jobs for up to --drain-timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotplate.settings import RECIPE_FIELDS, SETTINGS, Settings

NODE_CACHE_ENV = "HOTPLATE_NODE_CACHE"
APP_NAME = "hotplate"
MULTIPLEX_HEADER = "serve_multiplexed_model_id"


def settings_env(settings: Settings) -> dict[str, str]:
    """Every setting, and the recipe fields the settings set, as the HOTPLATE_* variables
    load_settings reads: a field left to its default stays unset, so that a backend's
    implied recipe still applies to it on the replica (`Recipe.explicit`)."""
    env = {}
    for name in SETTINGS:
        value = getattr(settings, name)
        # paths absolute: a replica's working directory is not the driver's
        env[f"HOTPLATE_{name.upper()}"] = str(value.resolve() if isinstance(value, Path) else value)
    for name in sorted(settings.recipe.explicit & RECIPE_FIELDS):
        env[f"HOTPLATE_{name.upper()}"] = str(getattr(settings.recipe, name))
    return env


def node_settings() -> Settings:
    """The settings a replica or task runs with: runtime_env's, and this node's cache."""
    import ray

    from cachestore.remote.ray_flight import ADDRESS_ENV
    from cachestore.remote.tier import attach
    from hotplate.settings import load_settings

    settings = load_settings()
    if os.environ.get(NODE_CACHE_ENV):
        settings.cache = Path(os.environ[NODE_CACHE_ENV])
    attach(settings.cache, settings.remote, settings.remote_key)
    # the render workers this process spawns join the cluster for its single flight
    os.environ[ADDRESS_ENV] = ray.get_runtime_context().gcs_address
    return settings


_HOT: Any = None


def _hot_loader() -> Any:
    """Serve's multiplexed loader: an avatar "loaded" on a replica is one it served."""
    global _HOT
    if _HOT is None:
        from ray import serve

        @serve.multiplexed(max_num_models_per_replica=256)
        async def hot(model_id: str) -> str:
            return model_id

        _HOT = hot
    return _HOT


def replica_app(options: dict[str, Any], wanted: int = 1) -> Any:
    """The FastAPI app of one replica (Serve calls this in the replica); `wanted`: the
    replicas the deployment runs at least, which its `/readyz` waits for."""
    import ray
    from ray import serve

    from hotplate.cluster import peers
    from hotplate.cluster.readiness import Readiness
    from hotplate.serve.app import ServeConfig, create_app
    from hotplate.serve.routes.health import service_readiness

    settings = node_settings()
    # job records and videos are one server's own (`claim_data_dir`): each replica gets a
    # folder of its own under the node's data dir, while the node's store is shared
    base = options.get("data_dir") or ServeConfig(settings=settings).data
    context = serve.get_replica_context()
    replica = context.replica_id.unique_id
    tag = peers.replica_tag(replica)  # its job ids start with it: peers.py routes them
    options = {**options, "data_dir": Path(base) / f"replica-{replica}", "replica": tag}
    config = ServeConfig(settings=settings, **options)
    app = create_app(config)
    node = ray.get_runtime_context().get_node_id()

    @app.middleware("http")
    async def route_by_avatar(request: Any, call_next: Any) -> Any:
        model = serve.get_multiplexed_model_id() if "hotplate.peer" not in request.scope else ""
        if model:
            await _hot_loader()(model)  # Serve now routes this avatar's requests here
        response = await call_next(request)
        response.headers["x-hotplate-node"] = node
        response.headers["x-hotplate-replica"] = tag
        return response

    # another replica's jobs are answered there (outermost: before the guard, which
    # the owner runs on the forwarded request)
    secret, book = peers.peer_secret(config.signing_key), peers.peer_book()
    app.add_middleware(peers.PeerRouter, tag=tag, secret=secret, book=book)
    # /readyz: 200 only when the whole deployment can answer (readiness.py)
    app.state.whole = whole = Readiness(
        tag,
        config.signing_key,
        secret,
        book,
        wanted,
        lambda: service_readiness(app.state.service)["ready"],
        context.app_name,
        context.deployment,
    )
    serve_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> Any:
        async with serve_lifespan(a):  # the service and its render workers first
            host = ray.util.get_node_ip_address()
            server, url = await peers.listen(app, host, secret, whole.probe_answer)
            whole.url, registered = url, None
            try:
                # in the book before the start finishes: Serve routes nothing here until
                # then, so every job id this replica gives out is one the others can find
                await peers.register(book, tag, url)
                registered = asyncio.ensure_future(peers.keep_registered(book, tag, url))
                yield
            finally:
                if registered is not None:
                    registered.cancel()
                book.drop.remote(tag, url)
                await peers.stop(server)

    app.router.lifespan_context = lifespan
    return app


def application(
    settings: Settings,
    options: dict[str, Any],
    replicas: int,
    max_replicas: int | None = None,
    per_node: int | None = None,
    gpus: float = 0.0,
) -> Any:
    """The Serve application: `replicas` copies (autoscaled on queue depth up to
    `max_replicas`), at most `per_node` on one node, `gpus` GPUs each. The replicas
    share one signing key (`options["signing_key"]`, drawn here when none is set): a URL
    one signs, the others accept, and it keys their forwarding (peers.py)."""
    from ray import serve

    options = {**options, "signing_key": options.get("signing_key") or secrets.token_hex(32)}

    def build() -> Any:
        return replica_app(options, wanted=replicas)

    scaling: dict[str, Any] = {"num_replicas": replicas}
    if max_replicas and max_replicas > replicas:
        scaling = {
            "autoscaling_config": {
                "min_replicas": replicas,
                "max_replicas": max_replicas,
                "target_ongoing_requests": 2,  # queue depth per replica before another starts
            }
        }
    if per_node:
        scaling["max_replicas_per_node"] = per_node

    @serve.deployment(
        name="hotplate",
        ray_actor_options={
            "num_cpus": 1,
            "num_gpus": gpus,
            "runtime_env": {"env_vars": settings_env(settings)},
        },
        # a replica takes what its workers can run (plus one being handed over); the rest
        # wait in Serve, which sends them to whichever replica frees up first
        max_ongoing_requests=options.get("workers", 1) + 1,
        # a replica being stopped drains as `hotplate serve` does on SIGTERM: Serve sends
        # it nothing new and waits for its requests, then its lifespan waits for its
        # queued jobs (--drain-timeout), plus time to stop the workers
        graceful_shutdown_wait_loop_s=1.0,
        graceful_shutdown_timeout_s=drain_seconds(options) + 15.0,
        **scaling,
    )
    @serve.ingress(build)
    class Hotplate:
        pass

    return Hotplate.bind()


def drain_seconds(options: dict[str, Any]) -> float:
    from hotplate.serve.config import ServeConfig, seconds

    return seconds(options.get("drain_timeout", ServeConfig.drain_timeout)) or 0.0


def connect(address: str) -> None:
    """Join the cluster at `address`; `auto` or `local`: the one running here, else a new one."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # hotplate sends nothing home
    import ray

    kwargs = {"namespace": "hotplate", "log_to_driver": False, "logging_level": "ERROR"}
    if address in ("auto", "local"):
        try:
            ray.init(address="auto", **kwargs)
        except ConnectionError:
            ray.init(**kwargs)
    else:
        ray.init(address=address, **kwargs)


def deploy(
    settings: Settings,
    options: dict[str, Any],
    address: str,
    replicas: int,
    host: str,
    port: int,
    max_replicas: int | None = None,
    per_node: int | None = None,
) -> str:
    """Deploy on the cluster and return the URL; returns once the replicas are ready."""
    import ray
    from ray import serve

    from cachestore.remote.ray_flight import flight_actor
    from hotplate.cluster.peers import peer_book

    if not ray.is_initialized():
        connect(address)
    flight_actor()  # the cluster's single flight, made before any replica asks for it
    peer_book()  # where the replicas find each other
    gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= replicas else 0.0
    # one HTTP proxy, on the head node: nodes sharing a machine cannot all bind the port
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
    app = application(settings, options, replicas, max_replicas, per_node, gpus)
    serve.run(app, name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port}/"


def run_forever(address: str, start: Callable[[], str], echo: Any) -> None:
    """Join the cluster, deploy (`start()` returns the URL), block until Ctrl-C or SIGTERM,
    then take the app down gracefully (its replicas drain; the cluster stays). SIGTERM is
    caught after ray.init (whose own handler would kill the process) and before the
    deploy, so one that comes as soon as the app answers is a drain, never a kill."""
    import signal

    import ray
    from ray import serve

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if not ray.is_initialized():
        connect(address)
    # SIGTERM (systemd, docker stop) takes the app down as Ctrl-C does
    signal.signal(signal.SIGTERM, stop)
    try:
        url = start()
        echo(f"hotplate serve --ray: {url} (Ctrl-C or SIGTERM stops the app, not the cluster)")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the wait at once
        serve.delete(APP_NAME)
