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
from shadow_proxy.serving.logs import CLIENT_ERROR_KINDS

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
    client_connections: Gauge
    connections_refused: Counter
    rejected_requests: Counter
    body_timeouts: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ProxyMetrics:
        metrics = cls._create(registry)
        for kind in UPSTREAM_ERROR_KINDS:  # series exist (at 0) before the first error
            metrics.upstream_errors.labels(kind)
        for kind in CLIENT_ERROR_KINDS:
            metrics.rejected_requests.labels(kind)
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
            client_connections=Gauge(
                "shadow_proxy_client_connections",
                "Client connections open now (listen.max_connections bounds them).",
                registry=registry,
            ),
            connections_refused=Counter(
                "shadow_proxy_connections_refused",
                "Client connections answered 503 and closed: listen.max_connections reached.",
                registry=registry,
            ),
            rejected_requests=Counter(
                "shadow_proxy_rejected_requests",
                "Requests the HTTP parser rejected (400 from the proxy, never forwarded), by kind.",
                ["kind"],
                registry=registry,
            ),
            body_timeouts=Counter(
                "shadow_proxy_body_timeouts",
                "Requests whose body did not arrive within listen.body_timeout_s (408).",
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


#: The worker's family of requests that yield no record; the serving loop adds
#: the requests it answered itself before any hand-off (413, 408).
NOT_MIRRORED = "shadow_not_mirrored"


class WorkerMetricsRelay(Collector):
    """Re-exports the tap worker's latest metrics snapshot on this registry.

    The worker sends its collected metric families every second; ``update``
    replaces the snapshot and ``collect`` yields it, with the serving loop's
    own not-mirrored counts (``not_mirrored``) added to ``shadow_not_mirrored``
    (one family, whichever process saw the reason).
    """

    def __init__(self) -> None:
        self._families: list[Metric] = []
        #: reason -> requests on mirrored routes the serving loop answered
        #: itself, so the worker never saw them.
        self.serving_not_mirrored: dict[str, int] = {}

    def update(self, families: list[Metric]) -> None:
        self._families = families

    def not_mirrored(self, reason: str) -> None:
        """Count a mirrored-route request the serving loop answered itself."""
        self.serving_not_mirrored[reason] = self.serving_not_mirrored.get(reason, 0) + 1

    def collect(self) -> Iterable[Metric]:
        families = list(self._families)
        if not self.serving_not_mirrored:
            return families
        worker = next((f for f in families if f.name == NOT_MIRRORED), None)
        merged = Metric(
            NOT_MIRRORED,
            worker.documentation if worker else "Mirrored-route requests that yield no record.",
            "counter",
        )
        extra = dict(self.serving_not_mirrored)
        for sample in worker.samples if worker else ():
            reason = sample.labels.get("reason")
            value = sample.value
            if sample.name.endswith("_total") and reason in extra:
                value += extra.pop(reason)
            merged.add_sample(sample.name, sample.labels, value)
        for reason, value in extra.items():
            merged.add_sample(f"{NOT_MIRRORED}_total", {"reason": reason}, value)
        return [merged if f is worker else f for f in families] + ([] if worker else [merged])

    def describe(self) -> Iterable[Metric]:
        return []
