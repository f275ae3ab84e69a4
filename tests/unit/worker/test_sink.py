"""The record sink's record type: the two pieces around the seq, joined by whoever
takes the seq, read as one envelope with that seq. (The sinks: ``TapQueues`` in
test_tap_queue.py, the shard's outbox in test_outbox.py, the main's publishing.)"""

from __future__ import annotations

import msgpack

from shadow_proxy.worker.sink import EncodedRecord


class TestWithSeq:
    def test_joined_around_the_seq(self) -> None:
        head = msgpack.Packer().pack_map_header(2) + msgpack.packb("seq")
        record = EncodedRecord(head, msgpack.packb("tap") + msgpack.packb("kv"))
        for seq in (0, 200, 2**64 - 1):
            assert msgpack.unpackb(record.with_seq(seq)) == {"seq": seq, "tap": "kv"}
