"""The worker's metrics: per-tap counters read from the queues at collection time,
and the snapshot the serving process relays."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shadow_proxy.config.values import TapConfig
from shadow_proxy.records.filters import FilterSet
from shadow_proxy.serving.metrics import WorkerMetricsRelay
from shadow_proxy.worker.main.tap_queue import TapQueue
from shadow_proxy.worker.shard.metrics import WorkerMetrics


def queue(name: str) -> TapQueue:
    return TapQueue(TapConfig(name, name, "request", "inproc://x", FilterSet.parse([])))


class TestCollect:
    """What the queues counted is what the metrics say, at any moment."""

    def test_per_tap_counters(self) -> None:
        kv, replay = queue("kv"), queue("replay")
        metrics = WorkerMetrics([kv, replay])
        kv.offer(b"a")
        kv.offer(b"b")
        kv.published = 1
        kv.items.popleft()
        replay.drop("evicted", 2)
        replay.skip("sample")
        value = metrics.registry.get_sample_value
        assert value("shadow_tap_queued_total", {"tap": "kv"}) == 2
        assert value("shadow_tap_published_total", {"tap": "kv"}) == 1
        assert value("shadow_tap_queue_depth", {"tap": "kv"}) == 1
        assert value("shadow_tap_dropped_total", {"tap": "replay", "reason": "evicted"}) == 2
        assert value("shadow_tap_dropped_total", {"tap": "kv", "reason": "full"}) == 0
        assert value("shadow_tap_skipped_total", {"tap": "replay", "reason": "sample"}) == 1
        assert value("shadow_tap_publish_errors_total", {"tap": "replay"}) == 0

    def test_own_counters(self) -> None:
        metrics = WorkerMetrics([])
        metrics.not_mirrored.labels("invalid_json").inc()
        metrics.failures.labels("struct.error").inc()
        metrics.prompt_checks.labels("m").inc()
        value = metrics.registry.get_sample_value
        assert value("shadow_not_mirrored_total", {"reason": "invalid_json"}) == 1
        assert value("shadow_worker_failures_total", {"exception": "struct.error"}) == 1
        assert value("shadow_prompt_token_checks_total", {"model": "m"}) == 1


class TestSnapshot:
    """The snapshot is plain data; rebuilt on the serving side it reads the same."""

    def test_relayed_snapshot_equals_the_worker_registry(self) -> None:
        kv = queue("kv")
        metrics = WorkerMetrics([kv])
        kv.offer(b"a")
        metrics.preprocess_seconds.labels("chat").observe(0.003)
        snapshot = metrics.snapshot()
        assert all(isinstance(f, list) and len(f) == 4 for f in snapshot)
        registry = CollectorRegistry()
        relay = WorkerMetricsRelay()
        registry.register(relay)
        relay.update(snapshot)
        for labels, name in (
            ({"tap": "kv"}, "shadow_tap_queued_total"),
            ({"route": "chat", "le": "0.005"}, "shadow_preprocess_seconds_bucket"),
        ):
            assert (
                registry.get_sample_value(name, labels)
                == metrics.registry.get_sample_value(name, labels)
                == 1
            )
