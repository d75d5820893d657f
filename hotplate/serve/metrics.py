"""/metrics in the Prometheus text format (0.0.4), written by hand: a few families."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


def _histogram(name: str, help_text: str, values: Iterable[float]) -> list[str]:
    values = list(values)
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for bound in BUCKETS:
        lines.append(f'{name}_bucket{{le="{bound}"}} {sum(v <= bound for v in values)}')
    lines.append(f'{name}_bucket{{le="+Inf"}} {len(values)}')
    lines.append(f"{name}_sum {sum(values):.6f}")
    lines.append(f"{name}_count {len(values)}")
    return lines


def _single(name: str, kind: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]


def render_metrics(queue: Any, store: Any) -> str:
    """The text for GET /metrics from the job queue's stats and the store's counters."""
    stats = queue.stats
    lines = ["# HELP hotplate_renders_total Jobs finished since start, by outcome."]
    lines.append("# TYPE hotplate_renders_total counter")
    for state in ("done", "failed", "cancelled"):
        lines.append(f'hotplate_renders_total{{outcome="{state}"}} {stats.finished.get(state, 0)}')
    lines += _histogram(
        "hotplate_render_seconds",
        "Seconds from submission to a finished video.",
        stats.render_seconds,
    )
    lines += _single(
        "hotplate_jit_total",
        "counter",
        "Renders that precompiled just in time since start.",
        len(stats.jit_seconds),
    )
    lines += _histogram(
        "hotplate_jit_seconds", "Seconds spent in just-in-time precompiles.", stats.jit_seconds
    )
    from cachestore.leases import live_leases

    counters = {}
    with store.read() as r:
        for key, value in r.items("meta"):
            if key.startswith("count:"):
                counters[key[6:]] = value
    leases = len(live_leases(store.path, clean=False))
    lines += _single(
        "hotplate_cache_hits_total",
        "counter",
        "Requests that found their avatar hot (the store's counter, all clients).",
        counters.get("hits", 0),
    )
    lines += _single(
        "hotplate_cache_misses_total",
        "counter",
        "Precompiles that found their avatar cold (the store's counter, all clients).",
        counters.get("misses", 0),
    )
    lines += _single(
        "hotplate_queue_depth", "gauge", "Jobs waiting for a worker.", queue.queue.qsize()
    )
    lines += _single("hotplate_jobs_running", "gauge", "Jobs on a worker now.", len(queue.running))
    data = store.path / "data.mdb"
    lines += _single(
        "hotplate_store_bytes",
        "gauge",
        "Size of the store's data file.",
        data.stat().st_size if data.exists() else 0,
    )
    lines += _single(
        "hotplate_live_leases",
        "gauge",
        "Live render leases on the store (processes reading avatars now).",
        leases,
    )
    return "\n".join(lines) + "\n"
