"""A shard's metrics: the joiner's own counters, and the snapshot the relays carry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shadow_proxy.serving.metrics import WorkerMetricsRelay
from shadow_proxy.worker.shard.metrics import JoinerMetrics


class TestCounters:
    def test_own_counters(self) -> None:
        metrics = JoinerMetrics()
        metrics.not_mirrored.labels("invalid_json").inc()
        metrics.failures.labels("struct.error").inc()
        metrics.prompt_checks.labels("m").inc()
        value = metrics.tally.get_sample_value
        assert value("shadow_not_mirrored_total", {"reason": "invalid_json"}) == 1
        assert value("shadow_worker_failures_total", {"exception": "struct.error"}) == 1
        assert value("shadow_prompt_token_checks_total", {"model": "m"}) == 1


class TestSnapshot:
    """The snapshot is plain data; rebuilt on the serving side it reads the same."""

    def test_relayed_snapshot_equals_the_shard_tally(self) -> None:
        metrics = JoinerMetrics()
        metrics.preprocess_seconds.labels("chat").observe(0.003)
        families = metrics.tally.families()
        assert all(isinstance(f, list) and len(f) == 4 for f in families)
        registry = CollectorRegistry()
        relay = WorkerMetricsRelay()
        registry.register(relay)
        relay.update(1, families)
        labels, name = {"route": "chat", "le": "0.005"}, "shadow_preprocess_seconds_bucket"
        assert (
            registry.get_sample_value(name, labels)
            == metrics.tally.get_sample_value(name, labels)
            == 1
        )
