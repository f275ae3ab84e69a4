"""One tap's queue: bounded, never blocking, every loss counted with its reason."""

from __future__ import annotations

import pytest

from shadow_proxy.config.values import TapConfig
from shadow_proxy.exchange import DROP_REASONS
from shadow_proxy.records.filters import FilterSet
from shadow_proxy.worker.main.tap_queue import TapQueue


def queue(capacity: int = 2) -> TapQueue:
    config = TapConfig(
        "kv", "t", "request", "tcp://127.0.0.1:1", FilterSet.parse([]), capacity=capacity
    )
    return TapQueue(config)


class TestOffer:
    """Up to capacity records wait; the next is dropped as ``full``, never waited on."""

    def test_capacity_then_full(self) -> None:
        q = queue(capacity=2)
        assert [q.offer(b"a"), q.offer(b"b"), q.offer(b"c")] == [True, True, False]
        assert list(q.items) == [b"a", b"b"]
        assert (q.queued, q.dropped["full"]) == (2, 1)

    def test_room_again_after_publishing(self) -> None:
        q = queue(capacity=1)
        q.offer(b"a")
        q.items.popleft()  # what the publisher does once sent
        assert q.offer(b"b")
        assert q.queued == 2 and q.dropped["full"] == 0


class TestSeq:
    """A seq is taken before the offer: a dropped record leaves a gap."""

    def test_seqs_from_zero(self) -> None:
        q = queue()
        assert [q.take_seq() for _ in range(3)] == [0, 1, 2]
        assert q.next_seq == 3

    def test_a_full_queue_leaves_a_gap(self) -> None:
        q = queue(capacity=1)
        for payload in (b"a", b"b", b"c"):
            q.take_seq()
            q.offer(payload)
        assert q.next_seq == 3 and q.queued == 1  # seqs 1 and 2 are gaps

    def test_drop_takes_seqs_and_counts_the_reason(self) -> None:
        q = queue()
        q.drop("handoff_full", 3)
        q.drop("evicted")
        assert q.next_seq == 4
        assert (q.dropped["handoff_full"], q.dropped["evicted"]) == (3, 1)

    def test_an_unknown_reason_is_a_bug(self) -> None:
        with pytest.raises(KeyError):
            queue().drop("whatever")


class TestSkipAndClose:
    """Skips are not losses; closing loses what is queued, counted as ``closed``."""

    def test_skip_takes_no_seq(self) -> None:
        q = queue()
        q.skip("sample")
        q.skip("sample")
        q.skip("models")
        assert q.skipped == {"sample": 2, "models": 1}
        assert q.next_seq == 0 and sum(q.dropped.values()) == 0

    def test_close(self) -> None:
        q = queue(capacity=5)
        q.offer(b"a")
        q.offer(b"b")
        assert q.close() == 2
        assert not q.items and q.dropped["closed"] == 2
        assert not q.offer(b"c")
        assert q.dropped["closed"] == 3

    def test_every_reason_starts_at_zero(self) -> None:
        assert queue().dropped == dict.fromkeys(DROP_REASONS, 0)
        assert queue().name == "kv"


class TestTapQueues:
    """Every tap's queue as a record sink: the seq is taken here, in order, and a
    record dropped (full) still took its own."""

    def test_seqs_taken_and_written(self) -> None:
        import msgpack

        from shadow_proxy.exchange import DropReason
        from shadow_proxy.worker.main.tap_queue import TapQueues
        from shadow_proxy.worker.sink import EncodedRecord

        config = TapConfig(
            "kv", "t", "request", "tcp://127.0.0.1:1", FilterSet.parse([]), capacity=1
        )
        sink = TapQueues([config])
        head = msgpack.Packer().pack_map_header(1) + msgpack.packb("seq")
        sink.drop(0, DropReason.EVICTED)
        sink.record(0, EncodedRecord(head, b""), 5)
        sink.record(0, EncodedRecord(head, b""), 6)  # full: dropped, its seq taken
        sink.skip(0, "sample")
        (q,) = sink
        assert [msgpack.unpackb(item) for item in q.items] == [{"seq": 1}]
        assert (list(q.ready), list(q.seqs)) == ([5], [1])
        assert q.next_seq == 3 and q.dropped["full"] == 1 and q.skipped == {"sample": 1}
