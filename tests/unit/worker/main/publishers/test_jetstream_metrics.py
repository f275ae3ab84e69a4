"""The JetStream taps' metrics, collected from the stats the link's thread keeps
and read through a real prometheus registry, as the worker relays them."""

from __future__ import annotations

import attrs
import pytest
from prometheus_client import CollectorRegistry

from shadow_proxy.worker.main.publishers.jetstream_metrics import (
    ACK_BUCKETS,
    STREAM_PROBLEMS,
    AckHistogram,
    JetStreamMetrics,
    LinkStats,
    TapStats,
)


@attrs.define
class Publisher:
    """What the collector reads of a publisher: its stats and its in-flight count."""

    stats: TapStats
    in_flight: int = 0


class TestAckHistogram:
    """Cumulative buckets, ``+Inf`` last, a total of the observed seconds."""

    def test_buckets(self) -> None:
        histogram = AckHistogram()
        for seconds in (0.0001, 0.001, 0.003, 400.0):
            histogram.observe(seconds)
        buckets = dict(histogram.buckets())
        assert list(buckets)[-1] == "+Inf" and len(buckets) == len(ACK_BUCKETS) + 1
        assert (buckets["0.0005"], buckets["0.001"], buckets["0.005"]) == (1, 2, 3)
        assert (buckets["300"], buckets["+Inf"]) == (3, 4)
        assert histogram.total == pytest.approx(400.0041)


class TestCollector:
    """Every family with tap labels from the configuration and fixed reason words."""

    def test_families(self) -> None:
        kv = Publisher(TapStats("kv"), in_flight=3)
        kv.stats.retries = 2
        kv.stats.ack_seconds.observe(0.02)
        link = LinkStats(connected=True, reconnects=1)
        link.stream_problems["subjects"] = 4
        link.refusals = 5
        registry = CollectorRegistry()
        registry.register(JetStreamMetrics(link, [kv, Publisher(TapStats("replay"))]))
        value = registry.get_sample_value
        assert value("shadow_tap_publish_retries_total", {"tap": "kv"}) == 2
        assert value("shadow_tap_awaiting_ack", {"tap": "kv"}) == 3
        assert value("shadow_tap_awaiting_ack", {"tap": "replay"}) == 0
        assert value("shadow_tap_ack_seconds_count", {"tap": "kv"}) == 1
        assert value("shadow_tap_ack_seconds_bucket", {"tap": "kv", "le": "0.025"}) == 1
        assert value("shadow_tap_ack_seconds_bucket", {"tap": "kv", "le": "0.01"}) == 0
        assert value("shadow_tap_ack_seconds_sum", {"tap": "kv"}) == pytest.approx(0.02)
        assert value("shadow_nats_connected") == 1
        assert value("shadow_nats_reconnects_total") == 1
        assert value("shadow_nats_refusals_total") == 5
        problems = {
            r: value("shadow_nats_stream_problems_total", {"reason": r}) for r in STREAM_PROBLEMS
        }
        expected = {"subjects": 4, "refused": 0, "missing": 0, "unavailable": 0, "no_answer": 0}
        assert problems == expected

    def test_reads_the_current_numbers(self) -> None:
        link = LinkStats()
        publishers: list[Publisher] = []
        registry = CollectorRegistry()
        registry.register(JetStreamMetrics(link, publishers))
        assert registry.get_sample_value("shadow_nats_connected") == 0
        publishers.append(Publisher(TapStats("late"), in_flight=5))
        link.connected = True
        assert registry.get_sample_value("shadow_tap_awaiting_ack", {"tap": "late"}) == 5
        assert registry.get_sample_value("shadow_nats_connected") == 1
