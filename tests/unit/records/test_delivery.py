"""What every source shares: deduplication by (publisher_id, tap, seq), counts."""

from __future__ import annotations

from shadow_proxy.records import wire
from shadow_proxy.records.delivery import Deduplicator, Delivery, SourceStats


def test_each_seq_once_per_publisher_and_tap() -> None:
    dedup = Deduplicator()
    assert dedup.first_time(1, "kv", 0) and dedup.first_time(1, "kv", 1)
    assert not dedup.first_time(1, "kv", 0)
    assert dedup.first_time(2, "kv", 0) and dedup.first_time(1, "other", 0)


def test_publisher_zero_is_never_a_repeat() -> None:
    """Files written before publisher ids were kept cannot be told apart."""
    dedup = Deduplicator()
    assert dedup.first_time(0, "kv", 0) and dedup.first_time(0, "kv", 0)


async def test_ack_is_a_no_op_without_one() -> None:
    delivery = Delivery(wire.Message("t", 1, 0, 0, b""), None)
    await delivery.ack()
    assert delivery.acknowledgement is None


def test_stats_count_rejections_by_reason() -> None:
    stats = SourceStats()
    stats.reject("headers", 10)
    stats.reject("headers", 5)
    assert stats.as_dict()["unreadable"] == {"headers": 2}
    assert stats.unreadable_bytes == 15
