"""The serving process's metrics: fixed label values, series present from the start,
the worker's snapshot relayed as it is."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from shadow_proxy.serving.metrics import (
    UPSTREAM_ERROR_KINDS,
    ProxyMetrics,
    WorkerMetricsRelay,
    loop_lag_histogram,
    status_class,
)


@pytest.mark.parametrize(
    ("status", "label"),
    [
        (100, "1xx"),
        (200, "2xx"),
        (204, "2xx"),
        (304, "3xx"),
        (404, "4xx"),
        (599, "5xx"),
        (99, "other"),
        (600, "other"),
        (0, "other"),
    ],
)
def test_status_class(status: int, label: str) -> None:
    assert status_class(status) == label


class TestProxyMetrics:
    """One registry per app; upstream error series exist at 0 before the first error."""

    def test_upstream_error_series_start_at_zero(self) -> None:
        registry = CollectorRegistry()
        ProxyMetrics.create(registry)
        for kind in UPSTREAM_ERROR_KINDS:
            assert (
                registry.get_sample_value("shadow_proxy_upstream_errors_total", {"kind": kind}) == 0
            )

    def test_buckets_reach_twenty_minutes(self) -> None:
        registry = CollectorRegistry()
        metrics = ProxyMetrics.create(registry)
        metrics.stats.started()
        metrics.stats.finished("chat", 200, 1000)
        value = registry.get_sample_value(
            "shadow_proxy_request_duration_seconds_bucket", {"route": "chat", "le": "1200.0"}
        )
        assert value == 1

    def test_two_apps_two_registries(self) -> None:
        a, b = CollectorRegistry(), CollectorRegistry()
        stats = ProxyMetrics.create(a).stats
        stats.started()
        stats.finished("chat", 204, 0.1)
        ProxyMetrics.create(b)
        labels = {"route": "chat", "status_class": "2xx"}
        assert a.get_sample_value("shadow_proxy_requests_total", labels) == 1
        assert b.get_sample_value("shadow_proxy_requests_total", labels) is None

    def test_loop_lag_histogram_only_when_asked(self) -> None:
        registry = CollectorRegistry()
        ProxyMetrics.create(registry)
        assert b"shadow_proxy_loop_lag_seconds" not in generate_latest(registry)
        loop_lag_histogram(registry).observe(0.001)
        assert b"shadow_proxy_loop_lag_seconds_bucket" in generate_latest(registry)


class TestWorkerMetricsRelay:
    """The worker's latest snapshot is exported as it is; an update replaces it whole.
    (Across a worker's death: tests/unit/serving/test_metrics_relay_restart.py.)"""

    @staticmethod
    def family(value: float) -> list:
        return [
            "shadow_tap_queued",
            "counter",
            "Records queued.",
            [["shadow_tap_queued_total", {"tap": "kv"}, value]],
        ]

    def test_relays_the_latest_snapshot(self) -> None:
        registry = CollectorRegistry()
        relay = WorkerMetricsRelay()
        registry.register(relay)
        assert registry.get_sample_value("shadow_tap_queued_total", {"tap": "kv"}) is None
        relay.update(1, [self.family(3)])
        assert registry.get_sample_value("shadow_tap_queued_total", {"tap": "kv"}) == 3
        relay.update(1, [self.family(5)])
        assert registry.get_sample_value("shadow_tap_queued_total", {"tap": "kv"}) == 5
        relay.update(1, [])
        assert registry.get_sample_value("shadow_tap_queued_total", {"tap": "kv"}) is None
