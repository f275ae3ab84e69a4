"""What every record source shares: a ``Delivery``, the counts, deduplication,
and ``RecordSource``, the base that decodes and checks (SPEC section 8).

The sources themselves are ``file_source.FileSource``, ``tap_source.TapSource``
and ``jetstream_source.JetStreamSource``; ``sources`` picks one from a tool's
arguments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs

from shadow_proxy.records import wire
from shadow_proxy.records.envelope import check_envelope
from shadow_proxy.records.seqs import SeqTracker

#: An acknowledgement: awaited once the record is handled.
Ack = Callable[[], Awaitable[None]]


@attrs.frozen
class Delivery:
    """One record (or heartbeat) as a source delivered it."""

    #: Transport fields: topic, publisher id, transport sequence, publish time, payload.
    message: wire.Message
    #: The decoded record; None for a heartbeat.
    envelope: dict[str, Any] | None
    heartbeat: wire.Heartbeat | None = None
    #: Where it came from: a file path, an endpoint, a stream.
    where: str = ""
    _ack: Ack | None = None

    async def ack(self) -> None:
        """Say the record was handled (JetStream); a no-op for other sources."""
        if self._ack is not None:
            await self._ack()

    @property
    def acknowledgement(self) -> Ack | None:
        """The acknowledgement alone (it holds no record: JetStream's holds the
        reply subject), for a caller that acknowledges once its result is
        written; None where there is nothing to acknowledge."""
        return self._ack


@attrs.define
class SourceStats:
    """What a source read, skipped and could not read."""

    records: int = 0
    heartbeats: int = 0
    duplicates: int = 0
    #: Unreadable or malformed input by reason (fixed words, never client text).
    unreadable: dict[str, int] = attrs.field(factory=dict)
    unreadable_bytes: int = 0
    files: int = 0

    def reject(self, reason: str, size: int = 0) -> None:
        self.unreadable[reason] = self.unreadable.get(reason, 0) + 1
        self.unreadable_bytes += size

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "heartbeats": self.heartbeats,
            "duplicates": self.duplicates,
            "unreadable": dict(sorted(self.unreadable.items())),
            "unreadable_bytes": self.unreadable_bytes,
            "files": self.files,
        }


@attrs.define
class Deduplicator:
    """Counts each ``(publisher_id, tap, seq)`` once (publisher id 0: never a repeat)."""

    seen: dict[tuple[int, str], SeqTracker] = attrs.field(factory=dict)

    def first_time(self, publisher_id: int, tap: str, seq: int) -> bool:
        if publisher_id == 0:
            return True
        tracker = self.seen.get((publisher_id, tap))
        if tracker is None:
            tracker = self.seen[publisher_id, tap] = SeqTracker()
        return tracker.observe(seq)


class RecordSource:
    """The common part of every source: decoding, checking, deduplication."""

    #: Whether records arrive as they happen (live) or are read from storage.
    live = False
    #: Whether a delivery not acknowledged is delivered again (JetStream): a
    #: caller that keeps records must have them written before it acknowledges.
    redelivers = False

    def __init__(self, *, dedup: bool = True, heartbeats: bool = False) -> None:
        self.stats = SourceStats()
        self.heartbeats = heartbeats
        self._dedup = Deduplicator() if dedup else None

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self.deliveries()

    def deliveries(self) -> AsyncIterator[Delivery]:
        raise NotImplementedError

    async def open(self) -> None:
        """Connect now, so that a missing source is found before any work
        (``SourceError``); iterating opens it too."""

    async def aclose(self) -> None:
        """Release sockets and connections (idempotent)."""

    def describe(self) -> str:
        raise NotImplementedError

    def _record(self, message: wire.Message, where: str, ack: Ack | None = None) -> Delivery | None:
        """A delivery for a record message, or None (counted) when it is not one."""
        try:
            envelope = wire.decode_envelope(message.payload)
        except wire.WireError as e:
            self.stats.reject(e.reason, len(message.payload))
            return None
        reason = check_envelope(envelope)
        if reason is not None:
            self.stats.reject(reason, len(message.payload))
            return None
        dedup = self._dedup
        if dedup is not None and not dedup.first_time(
            message.publisher_id, envelope["tap"], envelope["seq"]
        ):
            self.stats.duplicates += 1
            return None
        self.stats.records += 1
        return Delivery(message, envelope, where=where, ack=ack)

    def _heartbeat(self, message: wire.Message, where: str) -> Delivery | None:
        try:
            heartbeat = wire.Heartbeat.decode(message.payload)
        except wire.WireError as e:
            self.stats.reject(e.reason, len(message.payload))
            return None
        if heartbeat.publisher_id != message.publisher_id:
            self.stats.reject("heartbeat", len(message.payload))
            return None
        self.stats.heartbeats += 1
        return Delivery(message, None, heartbeat, where=where) if self.heartbeats else None
