"""Every metric of the serving process, created from one injected registry.

Label values come from fixed vocabularies (routes, status classes, error kinds,
reasons), never from the client. The tap worker's metrics live in the worker
process; ``WorkerMetricsRelay`` re-exports its latest snapshot here so that one
``/metrics`` shows both.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from shadow_proxy.metrics import LATENCY_BUCKETS

#: Event-loop lag (``SHADOW_PROXY_LOOP_LAG=1``): how late a 10 ms sleep wakes up.
LOOP_LAG_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05, 0.1, 0.25, 0.5, 1, 2.5,
)  # fmt: skip

UPSTREAM_ERROR_KINDS = (
    "connect",
    "connect_timeout",
    "read_timeout",
    "broken",
    "bad_response",
)


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


@attrs.define
class ProxyMetrics:
    """The serving loop's metrics."""

    registry: CollectorRegistry
    requests: Counter
    duration: Histogram
    ttfb: Histogram
    in_flight: Gauge
    client_disconnects: Counter
    upstream_errors: Counter
    handoff_dropped: Counter
    worker_restarts: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ProxyMetrics:
        metrics = cls._create(registry)
        for kind in UPSTREAM_ERROR_KINDS:  # series exist (at 0) before the first error
            metrics.upstream_errors.labels(kind)
        return metrics

    @classmethod
    def _create(cls, registry: CollectorRegistry) -> ProxyMetrics:
        return cls(
            registry=registry,
            requests=Counter(
                "shadow_proxy_requests",
                "Requests served, by route and response status class.",
                ["route", "status_class"],
                registry=registry,
            ),
            duration=Histogram(
                "shadow_proxy_request_duration_seconds",
                "From request arrival to the end of the response sent to the client.",
                ["route"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            ttfb=Histogram(
                "shadow_proxy_upstream_ttfb_seconds",
                "From request arrival to the first body byte from the frontend "
                "(time to first token for streams).",
                ["route"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            in_flight=Gauge(
                "shadow_proxy_in_flight_requests",
                "Requests being served now.",
                registry=registry,
            ),
            client_disconnects=Counter(
                "shadow_proxy_client_disconnects",
                "Clients that hung up before the response ended.",
                ["route"],
                registry=registry,
            ),
            upstream_errors=Counter(
                "shadow_proxy_upstream_errors",
                "Failures talking to the frontend, by kind.",
                ["kind"],
                registry=registry,
            ),
            handoff_dropped=Counter(
                "shadow_handoff_dropped",
                "Messages the serving loop could not hand to the tap worker, by reason.",
                ["reason"],
                registry=registry,
            ),
            worker_restarts=Counter(
                "shadow_worker_restarts",
                "Times the tap worker process died and was started again.",
                registry=registry,
            ),
        )


def loop_lag_histogram(registry: CollectorRegistry) -> Histogram:
    """The serving loop's lag, sampled only when ``SHADOW_PROXY_LOOP_LAG=1``."""
    return Histogram(
        "shadow_proxy_loop_lag_seconds",
        "How much later than asked the serving loop ran a task sleeping 10 ms.",
        buckets=LOOP_LAG_BUCKETS,
        registry=registry,
    )


class WorkerMetricsRelay(Collector):
    """Re-exports the tap worker's latest metrics snapshot on this registry.

    The worker sends its collected metric families every second; ``update``
    replaces the snapshot and ``collect`` yields it as it is.
    """

    def __init__(self) -> None:
        self._families: list[Metric] = []

    def update(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return list(self._families)

    def describe(self) -> Iterable[Metric]:
        return []
