"""Record lag: the bound, and the metrics it is seen through."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shadow_proxy.channel.tally import Tally
from shadow_proxy.worker.lag import (
    LAG_BUCKETS,
    LagBound,
    LateStage,
    intake_lag_histogram,
    late_counter,
    record_lag_histogram,
    shard_late_counter,
)


class TestBound:
    def test_late_only_past_the_bound(self) -> None:
        bound = LagBound.from_seconds(1.5)
        assert bound.max_lag_ns == 1_500_000_000
        assert not bound.late(1_000, 1_000 + 1_500_000_000)
        assert bound.late(1_000, 1_000 + 1_500_000_001)

    def test_no_bound(self) -> None:
        assert not LagBound.from_seconds(None).late(0, 10**18)


class TestMetrics:
    def test_buckets_up_to_ten_minutes_and_stages_exist(self) -> None:
        registry = CollectorRegistry()
        record_lag_histogram(registry).labels("kv").observe(599)
        late_counter(registry)
        shard = Tally()
        intake_lag_histogram(shard).observe(0.0005)
        shard_late_counter(shard)
        value = registry.get_sample_value
        assert LAG_BUCKETS[0] == 0.001 and LAG_BUCKETS[-1] == 600
        assert value("shadow_tap_record_lag_seconds_bucket", {"tap": "kv", "le": "300.0"}) == 0
        assert value("shadow_tap_record_lag_seconds_bucket", {"tap": "kv", "le": "600.0"}) == 1
        assert (
            shard.get_sample_value("shadow_worker_intake_lag_seconds_bucket", {"le": "0.001"}) == 1
        )
        for stage in LateStage:
            assert value("shadow_worker_late_total", {"stage": stage}) == 0
            assert shard.get_sample_value("shadow_worker_late_total", {"stage": stage}) == 0
