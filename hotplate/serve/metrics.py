"""/metrics: the server's Prometheus metrics (prometheus-client, one registry per app).

Names follow Prometheus's conventions: base units (seconds), `_total` for counters
(prometheus-client adds it), one family per quantity with labels for what varies.

- histograms: `hotplate_queue_wait_seconds{kind}` (submission to a worker taking it),
  `hotplate_http_request_duration_seconds{route,method}` (until the last byte of the
  answer, so a streamed or blocking render counts whole), `hotplate_first_fragment_seconds
  {kind}` (a stream's: from submission; a live session's: from its first audio),
  `hotplate_render_realtime_factor{kind,backend}` (audio seconds per second of rendering,
  JIT excluded: 1 is real time, higher is faster), `hotplate_render_seconds` (submission to
  a finished video) and `hotplate_jit_seconds`;
- counters: `hotplate_requests_admitted_total{kind}`, `hotplate_requests_refused_total
  {kind,reason}` (busy, draining, queue_full), `hotplate_videos_expired_total{reason}`
  (age, size), `hotplate_renders_total{outcome}`, `hotplate_jit_total`;
- gauges (read when scraped): `hotplate_workers`, `hotplate_workers_busy`,
  `hotplate_queue_depth{priority}`, and the store's `hotplate_cache_hits_total`,
  `hotplate_cache_misses_total`, `hotplate_store_bytes`, `hotplate_live_leases`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

disable_created_metrics()  # no `_created` series beside every counter and histogram

# the text exposition format generate_latest writes
MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
FACTOR = (0.1, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 3, 5, 10)


class Metrics:
    """The metric families one server updates; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.queue_wait = Histogram(
            "hotplate_queue_wait_seconds",
            "Seconds a job waited in the queue before a worker took it.",
            ["kind"],
            buckets=SECONDS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "hotplate_http_request_duration_seconds",
            "Seconds from a request's arrival to the last byte of its answer, by route.",
            ["route", "method"],
            buckets=SECONDS,
            registry=r,
        )
        self.first_fragment = Histogram(
            "hotplate_first_fragment_seconds",
            "Seconds to a stream's first video fragment (stream: from submission; "
            "live: from the first audio).",
            ["kind"],
            buckets=SECONDS,
            registry=r,
        )
        self.realtime_factor = Histogram(
            "hotplate_render_realtime_factor",
            "Audio seconds rendered per second of rendering, JIT excluded (1 = real time).",
            ["kind", "backend"],
            buckets=FACTOR,
            registry=r,
        )
        self.render_seconds = Histogram(
            "hotplate_render_seconds",
            "Seconds from submission to a finished video.",
            buckets=SECONDS,
            registry=r,
        )
        self.jit_seconds = Histogram(
            "hotplate_jit_seconds",
            "Seconds spent in just-in-time precompiles.",
            buckets=SECONDS,
            registry=r,
        )
        self.jit = Counter(
            "hotplate_jit", "Renders that precompiled just in time since start.", registry=r
        )
        self.renders = Counter(
            "hotplate_renders", "Jobs finished since start, by outcome.", ["outcome"], registry=r
        )
        for outcome in ("done", "failed", "cancelled", "interrupted"):
            self.renders.labels(outcome)
        self.admitted = Counter(
            "hotplate_requests_admitted",
            "Render, stream, live and precompile requests admitted to the queue.",
            ["kind"],
            registry=r,
        )
        self.refused = Counter(
            "hotplate_requests_refused",
            "Requests refused with 503 (or close code 1013), by why: busy (the expected "
            "start is past --max-wait), queue_full, draining.",
            ["kind", "reason"],
            registry=r,
        )
        self.expired = Counter(
            "hotplate_videos_expired",
            "Videos deleted by the retention rules: age (--keep-videos), size (--max-data-size).",
            ["reason"],
            registry=r,
        )
        for reason in ("age", "size"):
            self.expired.labels(reason)
        self.workers = Gauge("hotplate_workers", "Render worker processes.", registry=r)
        self.busy = Gauge("hotplate_workers_busy", "Workers running a job now.", registry=r)
        self.queue_depth = Gauge(
            "hotplate_queue_depth",
            "Jobs waiting for a worker, by priority (editor, background).",
            ["priority"],
            registry=r,
        )

    def watch(
        self,
        workers: Callable[[], float],
        busy: Callable[[], float],
        depth: Callable[[str], float],
        store: Any,
    ) -> None:
        """Read the gauges from the queue and the store when scraped, never kept in step."""
        self.workers.set_function(workers)
        self.busy.set_function(busy)
        for priority in ("editor", "background"):
            self.queue_depth.labels(priority).set_function(lambda p=priority: depth(p))
        self.registry.register(StoreCollector(store))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StoreCollector(Collector):
    """The store's own counters and size, read at scrape time (all clients of the store)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def describe(self):
        return []  # no fixed description: collect() reads the store

    def collect(self):
        from cachestore.leases import live_leases

        counters = {}
        with self.store.read() as r:
            for key, value in r.items("meta"):
                if key.startswith("count:"):
                    counters[key[6:]] = value
        yield CounterMetricFamily(
            "hotplate_cache_hits",
            "Requests that found their avatar hot (the store's counter, all clients).",
            value=counters.get("hits", 0),
        )
        yield CounterMetricFamily(
            "hotplate_cache_misses",
            "Precompiles that found their avatar cold (the store's counter, all clients).",
            value=counters.get("misses", 0),
        )
        data = self.store.path / "data.mdb"
        yield GaugeMetricFamily(
            "hotplate_store_bytes",
            "Size of the store's data file.",
            value=data.stat().st_size if data.exists() else 0,
        )
        yield GaugeMetricFamily(
            "hotplate_live_leases",
            "Live render leases on the store (processes reading avatars now).",
            value=len(live_leases(self.store.path, clean=False)),
        )


class RequestTimer:
    """ASGI middleware: every HTTP request's duration, by its route's template (never the
    raw path, whose ids would make a family per job), until the last byte is sent."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.request_seconds.labels(route, scope.get("method", "")).observe(
                time.perf_counter() - start
            )
