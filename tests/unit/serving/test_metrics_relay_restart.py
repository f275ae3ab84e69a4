"""The relay across a worker's death: counters continue from what the dead worker
counted (its final tap states included), gauges start again, and the serving
loop's own not-mirrored counts join the worker's family."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shadow_proxy.channel import checkpoint as cp
from shadow_proxy.serving.metrics import WorkerMetricsRelay


def snapshot(published: float, preprocessed: float, depth: float) -> list:
    return [
        [
            "shadow_tap_published",
            "counter",
            "Records sent.",
            [["shadow_tap_published_total", {"tap": "kv"}, published]],
        ],
        [
            "shadow_preprocess_seconds",
            "histogram",
            "Preprocessing.",
            [["shadow_preprocess_seconds_count", {"route": "chat"}, preprocessed]],
        ],
        [
            "shadow_tap_queue_depth",
            "gauge",
            "Records waiting.",
            [["shadow_tap_queue_depth", {"tap": "kv"}, depth]],
        ],
        [
            "shadow_not_mirrored",
            "counter",
            "Not mirrored.",
            [["shadow_not_mirrored_total", {"reason": "unknown_model"}, 2.0]],
        ],
    ]


class TestAcrossADeath:
    def test_counters_never_go_backwards(self) -> None:
        registry = CollectorRegistry()
        relay = WorkerMetricsRelay()
        registry.register(relay)
        value = registry.get_sample_value
        relay.update(1, snapshot(published=5, preprocessed=7, depth=3))
        relay.worker_died(1)
        # The checkpoint says 6 were published (one after the last snapshot), 4 lost.
        relay.dead_worker_finals(
            1, [cp.TapState(name="kv", publisher_id=1, published=6, dropped={"worker_died": 4})]
        )
        assert value("shadow_tap_published_total", {"tap": "kv"}) == 6
        assert value("shadow_tap_dropped_total", {"tap": "kv", "reason": "worker_died"}) == 4
        assert value("shadow_preprocess_seconds_count", {"route": "chat"}) == 7
        assert value("shadow_tap_queue_depth", {"tap": "kv"}) is None  # gone with the worker
        relay.update(2, snapshot(published=1, preprocessed=2, depth=1))  # the new worker
        assert value("shadow_tap_published_total", {"tap": "kv"}) == 7
        assert value("shadow_preprocess_seconds_count", {"route": "chat"}) == 9
        assert value("shadow_tap_queue_depth", {"tap": "kv"}) == 1

    def test_serving_not_mirrored_added(self) -> None:
        registry = CollectorRegistry()
        relay = WorkerMetricsRelay()
        registry.register(relay)
        relay.not_mirrored("too_large")
        relay.not_mirrored("unknown_model")
        value = registry.get_sample_value
        assert value("shadow_not_mirrored_total", {"reason": "too_large"}) == 1
        relay.update(1, snapshot(published=0, preprocessed=0, depth=0))
        assert value("shadow_not_mirrored_total", {"reason": "unknown_model"}) == 3
        assert value("shadow_not_mirrored_total", {"reason": "too_large"}) == 1

    def test_a_dead_workers_last_snapshot_read_late(self) -> None:
        """The worker's last snapshot, in flight when it died, read after the restart
        began: it counts for the dead worker, once."""
        registry = CollectorRegistry()
        relay = WorkerMetricsRelay()
        registry.register(relay)
        value = registry.get_sample_value
        relay.update(1, snapshot(published=5, preprocessed=7, depth=3))
        relay.worker_died(1)
        relay.update(2, snapshot(published=1, preprocessed=1, depth=1))
        relay.update(1, snapshot(published=6, preprocessed=9, depth=3))  # late
        assert value("shadow_tap_published_total", {"tap": "kv"}) == 7
        assert value("shadow_preprocess_seconds_count", {"route": "chat"}) == 10
        assert value("shadow_tap_queue_depth", {"tap": "kv"}) == 1  # the live worker's
