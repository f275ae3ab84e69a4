"""The handler's plain-number metrics read exactly as prometheus_client's would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from shadow_proxy.metrics import LATENCY_BUCKETS
from shadow_proxy.serving.metrics import ProxyMetrics, status_class

OBSERVATIONS = [
    ("chat", 200, 0.004, 0.001),
    ("chat", 200, 0.005, 0.005),  # on a bucket bound: counted in it (le)
    ("chat", 499, 31.0, None),
    ("completions", 502, 0.3, 0.2),
    ("other", 0, 5000.0, 4000.0),  # over the last bound: +Inf only
]


def reference() -> bytes:
    """The same observations through prometheus_client, as the handler did before."""
    registry = CollectorRegistry()
    requests = Counter(
        "shadow_proxy_requests",
        "Requests served, by route and response status class.",
        ["route", "status_class"],
        registry=registry,
    )
    duration = Histogram(
        "shadow_proxy_request_duration_seconds",
        "From request arrival to the end of the response sent to the client.",
        ["route"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    ttfb = Histogram(
        "shadow_proxy_upstream_ttfb_seconds",
        "From request arrival to the first body byte from the frontend "
        "(time to first token for streams).",
        ["route"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    in_flight = Gauge(
        "shadow_proxy_in_flight_requests", "Requests being served now.", registry=registry
    )
    for route, status, seconds, first in OBSERVATIONS:
        in_flight.inc()
        if first is not None:
            ttfb.labels(route).observe(first)
        in_flight.dec()
        requests.labels(route, status_class(status)).inc()
        duration.labels(route).observe(seconds)
    in_flight.inc()  # one still in flight
    return generate_latest(registry)


NAMES = (
    "shadow_proxy_requests",
    "shadow_proxy_request_duration_seconds",
    "shadow_proxy_upstream_ttfb_seconds",
    "shadow_proxy_in_flight_requests",
)


def name_of(line: str) -> str:
    if line.startswith("#"):
        return line.split(" ")[2]
    return line.split("{")[0].split(" ")[0]


def without_created(text: bytes) -> list[str]:
    """The lines of these four metrics, ``_created`` samples left out."""
    return sorted(
        line
        for line in text.decode().splitlines()
        if "_created" not in line and name_of(line).startswith(NAMES)
    )


class TestRequestStats:
    def test_same_exposition_as_prometheus_client(self):
        registry = CollectorRegistry()
        stats = ProxyMetrics.create(registry).stats
        for route, status, seconds, first in OBSERVATIONS:
            stats.started()
            if first is not None:
                stats.first_byte(route, first)
            stats.finished(route, status, seconds)
        stats.started()
        ours = without_created(generate_latest(registry))
        assert len(ours) > 80
        assert ours == without_created(reference())
        assert (
            registry.get_sample_value(
                "shadow_proxy_request_duration_seconds_bucket", {"route": "chat", "le": "0.005"}
            )
            == 2
        )
