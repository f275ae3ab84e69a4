"""The main's tap metrics: per-tap counters read from the queues at collection time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shadow_proxy.config.values import TapConfig
from shadow_proxy.records.filters import FilterSet
from shadow_proxy.worker.main.metrics import TapMetrics
from shadow_proxy.worker.main.tap_queue import TapQueue


def queue(name: str) -> TapQueue:
    return TapQueue(TapConfig(name, name, "request", "inproc://x", FilterSet.parse([])))


class TestCollect:
    """What the queues counted is what the metrics say, at any moment."""

    def test_per_tap_counters(self) -> None:
        kv, replay = queue("kv"), queue("replay")
        registry = CollectorRegistry()
        registry.register(TapMetrics([kv, replay]))
        kv.offer(b"a")
        kv.offer(b"b")
        kv.published = 1
        kv.items.popleft()
        replay.drop("evicted", 2)
        replay.skip("sample")
        value = registry.get_sample_value
        assert value("shadow_tap_queued_total", {"tap": "kv"}) == 2
        assert value("shadow_tap_published_total", {"tap": "kv"}) == 1
        assert value("shadow_tap_queue_depth", {"tap": "kv"}) == 1
        assert value("shadow_tap_dropped_total", {"tap": "replay", "reason": "evicted"}) == 2
        assert value("shadow_tap_dropped_total", {"tap": "kv", "reason": "full"}) == 0
        assert value("shadow_tap_skipped_total", {"tap": "replay", "reason": "sample"}) == 1
        assert value("shadow_tap_publish_errors_total", {"tap": "replay"}) == 0
