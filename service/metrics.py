"""Prometheus metrics of one service instance.

Each app owns its own :class:`prometheus_client.CollectorRegistry` (several apps in one test
process do not collide). Label values are bounded: routes are templates
(``/v1/maps/{ref}/transform``), never raw paths; maps are ``name`` and ``version``.

Metrics
-------
vecbridge_request_duration_seconds{method, route, status}   histogram
vecbridge_batch_rows{route}                                  histogram of rows per request
vecbridge_jobs_total{state}                                  counter of jobs reaching a state
vecbridge_jobs_queued / vecbridge_jobs_running               gauges
vecbridge_map_use_total{map, version}                        counter of map applications
vecbridge_map_rows_total{map, version}                       counter of rows mapped
vecbridge_index_vectors{index}                               gauge of vectors per index
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

__all__ = ["ServiceMetrics", "CONTENT_TYPE_LATEST"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)


class ServiceMetrics:
    """The metric objects of one app, on a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_duration = Histogram(
            "vecbridge_request_duration_seconds", "HTTP request latency by route template",
            ["method", "route", "status"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram(
            "vecbridge_batch_rows", "Rows (vectors or texts) per request", ["route"],
            buckets=_BATCH_BUCKETS, registry=r)
        self.jobs_total = Counter("vecbridge_jobs_total", "Fit jobs that reached a state", ["state"], registry=r)
        self.jobs_queued = Gauge("vecbridge_jobs_queued", "Fit jobs waiting for a worker", registry=r)
        self.jobs_running = Gauge("vecbridge_jobs_running", "Fit jobs running now", registry=r)
        self.map_use = Counter("vecbridge_map_use_total", "Requests that applied a map", ["map", "version"], registry=r)
        self.map_rows = Counter("vecbridge_map_rows_total", "Rows mapped", ["map", "version"], registry=r)
        self.index_vectors = Gauge("vecbridge_index_vectors", "Vectors stored per index", ["index"], registry=r)

    def observe_map(self, name: str, version: int, rows: int) -> None:
        self.map_use.labels(name, str(version)).inc()
        self.map_rows.labels(name, str(version)).inc(rows)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
