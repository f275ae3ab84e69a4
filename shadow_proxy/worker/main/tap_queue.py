"""One tap's bounded queue, its ``seq`` and its loss counters (no sockets here).

``take`` takes a record's seq before it offers it to the queue, so a record that
is dropped leaves a gap in ``seq`` that a consumer can count. ``offer`` never
blocks: a full queue drops the record and counts ``full``. Every other loss the
worker can see is counted through ``drop`` with its own reason. ``TapQueues``
is every tap's queue as one ``RecordSink`` (``worker/sink.py``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

import attrs

from shadow_proxy.config import TapConfig
from shadow_proxy.exchange import DROP_REASONS, DropReason
from shadow_proxy.worker.sink import EncodedRecord


@attrs.define
class TapQueue:
    config: TapConfig
    next_seq: int = 0
    queued: int = 0
    #: Counted by the tap's publisher: records it sent, sends that failed.
    published: int = 0
    publish_errors: int = 0
    dropped: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    skipped: dict[str, int] = attrs.field(factory=dict)
    items: collections.deque[bytes] = attrs.field(factory=collections.deque)
    #: When each queued record was ready (monotonic ns): its lag is measured from there.
    ready: collections.deque[int] = attrs.field(factory=collections.deque)
    #: Each queued record's seq (a JetStream message carries it in its headers).
    seqs: collections.deque[int] = attrs.field(factory=collections.deque)
    closed: bool = False

    @property
    def name(self) -> str:
        return self.config.name

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def take(self, record: EncodedRecord, ready_mono_ns: int) -> bool:
        """A record: its seq taken and written in, then offered. False when dropped."""
        seq = self.take_seq()
        return self.offer(record.with_seq(seq), ready_mono_ns, seq)

    def offer(self, payload: bytes, ready_mono_ns: int = 0, seq: int = 0) -> bool:
        """Queue an encoded envelope whose seq is taken; never blocks. False when
        dropped (counted)."""
        if self.closed:
            self.dropped[DropReason.CLOSED] += 1
            return False
        if len(self.items) >= self.config.capacity:
            self.dropped[DropReason.FULL] += 1
            return False
        self.items.append(payload)
        self.ready.append(ready_mono_ns)
        self.seqs.append(seq)
        self.queued += 1
        return True

    def popleft(self) -> tuple[bytes, int, int]:
        """The oldest queued record, when it was ready, and its seq."""
        return self.items.popleft(), self.ready.popleft(), self.seqs.popleft()

    def drop(self, reason: DropReason, count: int = 1) -> None:
        """Count records lost before they reached the queue; their seqs are taken."""
        self.next_seq += count
        self.dropped[reason] += count

    def skip(self, reason: str) -> None:
        """A request the tap does not take (a select filter, the sample, a model
        list): not a loss, no seq."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def close(self) -> int:
        """Stop taking records; the ones still queued are lost as ``closed``."""
        self.closed = True
        lost = len(self.items)
        self.dropped[DropReason.CLOSED] += lost
        self.items.clear()
        self.ready.clear()
        self.seqs.clear()
        return lost


class TapQueues:
    """Every tap's queue, by index in ``config.taps``: a ``RecordSink`` whose seqs
    are taken here (an in-process joiner's; ``Publishing`` adds the checkpoints)."""

    def __init__(self, taps: Iterable[TapConfig]):
        self.queues = [TapQueue(tap) for tap in taps]

    def __len__(self) -> int:
        return len(self.queues)

    def __iter__(self) -> Iterator[TapQueue]:
        return iter(self.queues)

    def __getitem__(self, tap: int) -> TapQueue:
        return self.queues[tap]

    def record(self, tap: int, record: EncodedRecord, ready_mono_ns: int) -> None:
        self.queues[tap].take(record, ready_mono_ns)

    def drop(self, tap: int, reason: DropReason, count: int = 1) -> None:
        self.queues[tap].drop(reason, count)

    def skip(self, tap: int, reason: str) -> None:
        self.queues[tap].skip(reason)
