"""Every metric of the serving process, created from one injected registry.

Label values come from fixed vocabularies (routes, status classes, error kinds,
reasons), never from the client. The tap worker's metrics live in the worker
process; ``WorkerMetricsRelay`` re-exports its latest snapshot here so that one
``/metrics`` shows both.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from shadow_proxy.channel.checkpoint import TapState, counter_samples
from shadow_proxy.channel.families import Family, Totals
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


class _Histogram:
    """One labelled histogram as plain numbers: bucket counts (not cumulative), sum."""

    __slots__ = ("counts", "sum")

    def __init__(self, size: int):
        self.counts = [0] * size
        self.sum = 0.0


class RequestStats(Collector):
    """The handler's per-request metrics, as plain numbers.

    The serving loop is one thread, so a request costs a few integer updates
    and one ``bisect`` per histogram (about 0.4 µs against about 5.7 µs for the
    same five updates through ``prometheus_client``'s locked children); the
    families are built at scrape time, with the names, types and buckets of
    before: ``shadow_proxy_requests_total{route,status_class}``,
    ``shadow_proxy_request_duration_seconds{route}``,
    ``shadow_proxy_upstream_ttfb_seconds{route}``, ``shadow_proxy_in_flight_requests``.
    """

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.bounds = tuple(float(b) for b in buckets)
        self.in_flight = 0
        self._requests: dict[tuple[str, str], int] = {}
        self._duration: dict[str, _Histogram] = {}
        self._ttfb: dict[str, _Histogram] = {}

    def started(self) -> None:
        self.in_flight += 1

    def first_byte(self, route: str, seconds: float) -> None:
        self._observe(self._ttfb, route, seconds)

    def finished(self, route: str, status: int, seconds: float) -> None:
        self.in_flight -= 1
        key = (route, _STATUS_CLASSES.get(status) or status_class(status))
        self._requests[key] = self._requests.get(key, 0) + 1
        self._observe(self._duration, route, seconds)

    def _observe(self, table: dict[str, _Histogram], route: str, seconds: float) -> None:
        histogram = table.get(route)
        if histogram is None:
            histogram = table[route] = _Histogram(len(self.bounds) + 1)
        histogram.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        histogram.sum += seconds

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "shadow_proxy_requests",
            "Requests served, by route and response status class.",
            labels=["route", "status_class"],
        )
        for labels, value in self._requests.items():
            requests.add_metric(list(labels), value)
        in_flight = GaugeMetricFamily(
            "shadow_proxy_in_flight_requests", "Requests being served now.", value=self.in_flight
        )
        return [
            requests,
            self._histogram(
                "shadow_proxy_request_duration_seconds",
                "From request arrival to the end of the response sent to the client.",
                self._duration,
            ),
            self._histogram(
                "shadow_proxy_upstream_ttfb_seconds",
                "From request arrival to the first body byte from the frontend "
                "(time to first token for streams).",
                self._ttfb,
            ),
            in_flight,
        ]

    def _histogram(self, name: str, doc: str, table: dict[str, _Histogram]) -> Metric:
        family = HistogramMetricFamily(name, doc, labels=["route"])
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for route, histogram in table.items():
            cumulative, total = [], 0
            for le, count in zip(les, histogram.counts, strict=True):
                total += count
                cumulative.append((le, total))
            family.add_metric([route], cumulative, histogram.sum)
        return family

    def describe(self) -> Iterable[Metric]:
        return []


_STATUS_CLASSES = {status: status_class(status) for status in range(100, 600)}


@attrs.define
class ProxyMetrics:
    """The serving loop's metrics."""

    registry: CollectorRegistry
    #: Requests, durations, time to first byte, in flight (``RequestStats``).
    stats: RequestStats
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
        stats = RequestStats()
        registry.register(stats)
        return cls(
            registry=registry,
            stats=stats,
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
    """Re-exports the tap worker's metrics on this registry; never backwards.

    The worker sends its metric families every second, absolute values tagged
    with its generation; ``update`` keeps each generation's (``channel/families.py``:
    a snapshot read after its worker died still counts for it) and ``collect``
    yields them combined, with the serving loop's own not-mirrored counts
    (``not_mirrored``) added to ``shadow_not_mirrored`` (one family, whichever
    process saw the reason). When a worker dies, ``worker_died`` keeps what it
    counted and drops its gauges, and ``dead_worker_finals`` raises its taps'
    counters to their final values (from its checkpoint, plus the loss its death
    caused): the restarted worker's counts are added to those.
    """

    def __init__(self) -> None:
        self._totals = Totals()
        #: reason -> requests on mirrored routes the serving loop answered
        #: itself, so the worker never saw them.
        self.serving_not_mirrored: dict[str, int] = {}

    def update(self, generation: int, families: list[Family]) -> None:
        self._totals.update(generation, families)

    def worker_died(self, generation: int) -> None:
        self._totals.retire(generation)

    def dead_worker_finals(self, generation: int, finals: Iterable[TapState]) -> None:
        for state in finals:
            for sample, labels, value in counter_samples(state):
                family = sample.removesuffix("_total")
                doc = _TAP_DOCS[family]
                self._totals.raise_to(generation, family, "counter", doc, [(sample, labels, value)])

    def not_mirrored(self, reason: str) -> None:
        """Count a mirrored-route request the serving loop answered itself."""
        self.serving_not_mirrored[reason] = self.serving_not_mirrored.get(reason, 0) + 1

    def collect(self) -> Iterable[Metric]:
        families = self._totals.families()
        if self.serving_not_mirrored:
            families = _with_serving_not_mirrored(families, self.serving_not_mirrored)
        metrics = []
        for name, kind, doc, samples in families:
            metric = Metric(name, doc, kind)
            for sample_name, labels, value in samples:
                metric.add_sample(sample_name, labels, value)
            metrics.append(metric)
        return metrics

    def describe(self) -> Iterable[Metric]:
        return []


def _with_serving_not_mirrored(families: list[Family], extra: dict[str, int]) -> list[Family]:
    """``shadow_not_mirrored`` with the serving loop's counts added, reason by reason."""
    extra = dict(extra)
    out = []
    found = False
    for name, kind, doc, samples in families:
        if name == NOT_MIRRORED:
            found = True
            merged = []
            for sample_name, labels, value in samples:
                reason = labels.get("reason")
                if sample_name.endswith("_total") and reason in extra:
                    value += extra.pop(reason)
                merged.append([sample_name, labels, value])
            samples = merged + [
                [f"{NOT_MIRRORED}_total", {"reason": r}, v] for r, v in extra.items()
            ]
        out.append([name, kind, doc, samples])
    if not found:
        doc = "Mirrored-route requests that yield no record."
        samples = [[f"{NOT_MIRRORED}_total", {"reason": r}, v] for r, v in extra.items()]
        out.append([NOT_MIRRORED, "counter", doc, samples])
    return out


_TAP_DOCS = {
    "shadow_tap_queued": "Records put on the tap's queue.",
    "shadow_tap_published": "Records sent on the tap's socket.",
    "shadow_tap_dropped": "Records lost, by reason.",
    "shadow_tap_publish_errors": "Sends that failed.",
    "shadow_tap_skipped": "Requests the tap did not take (filters, sample, models): not a loss.",
}
