"""A shard's outbox: what its joiner publishes reaches the main as messages, in order,
and the taps touched are noted."""

from __future__ import annotations

import socket

from shadow_proxy.channel.stream import StreamDecoder, split_frames
from shadow_proxy.exchange import DropReason
from shadow_proxy.worker import messages
from shadow_proxy.worker.shard.outbox import Outbox
from shadow_proxy.worker.sink import EncodedRecord


class TestSink:
    def test_records_and_losses_become_messages(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            outbox = Outbox(ours)
            record = EncodedRecord(b"head", b"tail")
            outbox.record(0, record, 42)
            outbox.drop(2, DropReason.LATE)
            outbox.skip(1, "sample")
            assert outbox.touched == 0b111
            outbox.send(messages.Settle(b"\x00" * 8, (), True))
            outbox.flush()
            theirs.settimeout(5)
            decoder, got = StreamDecoder(), []
            while len(got) < 4:
                got += [messages.decode(split_frames(m)) for m in decoder.feed(theirs.recv(4096))]
            assert got == [
                messages.Record(0, 42, record),
                messages.Drop(2, DropReason.LATE, 1),
                messages.Skip(1, "sample"),
                messages.Settle(b"\x00" * 8, (), True),
            ]
        finally:
            ours.close()
            theirs.close()
