"""`hotplate sync --ray ADDRESS`: the fleet precompile as Ray tasks, one per source file.

Each task runs on some node with that node's store (`HOTPLATE_NODE_CACHE` or the cache
setting), precompiles its file as `hotplate precompile` does (a miss pulls from the blob
tier first; the cluster's single flight makes one build per avatar) and pushes what it
built before it returns, so the next node finds it. The personas folder must be at the
same path on every node (a shared mount), as for `hotplate serve --ray`.

Nothing is skipped on the driver: which node has what is each node's business, and a
task whose avatar is hot there costs a hash and a hit check. Progress is one line per
finished file, then the table `hotplate sync` prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotplate.settings import Settings


@dataclass
class TaskResult:
    persona: str
    attire: str
    motion: str
    path: str
    state: str  # "built", "pulled", "hot already" or "failed"
    seconds: float
    node: str
    error: str = ""
    push_failed: bool = False


def build_one(persona: str, attire: str, motion: str, path: str) -> TaskResult:
    """One task: make `path` hot in this node's store and push it if it was built."""
    import ray

    from cachestore.remote.push import wait_for_pushes
    from cachestore.remote.ray_flight import release_done
    from cachestore.store import open_store
    from hotplate.cluster.serve import node_settings
    from pipeline.catalog import recipe_for
    from pipeline.precompile.run import precompile_source

    node = ray.get_runtime_context().get_node_id()
    start = time.perf_counter()
    try:
        settings = node_settings()
        store = open_store(settings.cache)
        failures = store.read_value("meta", "count:push_failures") or 0
        recipe = recipe_for(settings.personas, persona, settings.recipe)
        # the file's avatar (and a video's mouth bank; a speech clip's bank alone)
        report, _ = precompile_source(Path(path), recipe, store, flight_wait=settings.flight_wait)
        wait_for_pushes()  # the task returns once the tier has what it built
        release_done()  # and the other nodes need not wait for its lease to run out
        state = "pulled" if report.pulled is not None else "hot already" if report.hit else "built"
        failed_push = (store.read_value("meta", "count:push_failures") or 0) > failures
        seconds = time.perf_counter() - start
        return TaskResult(persona, attire, motion, path, state, seconds, node, "", failed_push)
    except Exception as exc:
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        seconds = time.perf_counter() - start
        return TaskResult(persona, attire, motion, path, "failed", seconds, node, line)


def sync_on_ray(
    settings: Settings, address: str, echo: Callable[[str], None], task_cpus: float = 1.0
) -> list[TaskResult]:
    """Fan every source of the personas folder out as tasks; returns their results as
    they finished. echo gets one progress line per finished file."""
    import ray

    from cachestore.remote.ray_flight import flight_actor
    from hotplate.cluster.serve import connect, settings_env
    from pipeline.catalog import iter_sources

    if not ray.is_initialized():
        connect(address)
    flight_actor()
    sources = list(iter_sources(settings.personas))
    task = ray.remote(num_cpus=task_cpus, max_retries=1)(build_one).options(
        runtime_env={"env_vars": settings_env(settings)}
    )
    pending: dict[Any, Any] = {
        task.remote(s.persona, s.attire, s.motion, str(s.path.resolve())): s for s in sources
    }
    results: list[TaskResult] = []
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            pending.pop(ref)
            result: TaskResult = ray.get(ref)
            results.append(result)
            where = f"on node {result.node[:8]}"
            note = f": {result.error}" if result.error else ""
            if result.push_failed:
                note += " (push failed: the next node builds it again)"
            echo(
                f"[{len(results)}/{len(sources)}] {result.state} {result.persona}/{result.attire}/"
                f"{result.motion} in {result.seconds:.1f} s {where}{note}"
            )
    return results
