"""Where a tap's records go: the ``RecordSink`` protocol, and a record that waits
for its seq. Pure.

The joiner (``worker/shard/joiner.py``) builds and encodes each record and hands
it, or a counted loss, to the sink it was given when made. The sink is the one
owner of the taps' seqs: it takes the record's seq, writes it in, and queues the
record (or counts the loss with its seq taken, so a consumer sees the gap). Two
implementations:

- in a shard, ``worker/shard/outbox.py``: each call becomes a message to the
  worker's main (``worker/messages.py``);
- in the main, ``worker/main/publishing.py`` (and ``TapQueues``, the plain queues
  without checkpoints, for an in-process joiner): the seq is taken and the
  record queued for the tap's publisher.

So the joiner never sees a seq, and a shard never writes one: ``EncodedRecord``
is the envelope's MessagePack in two pieces, before and after the value of its
``seq``, joined by the sink around the seq it takes.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import msgpack

from shadow_proxy.exchange import DropReason


@attrs.frozen
class EncodedRecord:
    """An envelope's MessagePack without the value of its ``seq``: ``head`` ends
    with the key ``seq``, ``tail`` holds the fields after it."""

    head: bytes
    tail: bytes

    def with_seq(self, seq: int) -> bytes:
        """The record's bytes, as one ``packb`` of the envelope with this seq gives them."""
        return self.head + msgpack.packb(seq) + self.tail


class RecordSink(Protocol):
    """What the joiner publishes into, per tap (by index in ``config.taps``).
    Every call is final: a record or a loss is counted once, here."""

    def record(self, tap: int, record: EncodedRecord, ready_mono_ns: int) -> None:
        """A record, ready (its request arrived, or its response ended) at
        ``ready_mono_ns``: its seq is taken now."""

    def drop(self, tap: int, reason: DropReason, count: int = 1) -> None:
        """``count`` records lost before they existed; their seqs are taken."""

    def skip(self, tap: int, reason: str) -> None:
        """A request the tap does not take (its models, select filters, sample):
        not a loss, no seq."""
