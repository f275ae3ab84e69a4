"""The consumer: reads one tap's topic and keeps totals (SPEC section 7).

Pure accounting: frames or decoded deliveries in, totals out, no socket and
no clock of its own (callers pass ``now``, monotonic seconds). The runner is
``consumer/main.py``.

Gaps. Per publisher (one tap socket of one proxy process), ``seq`` values and
transport sequences are tracked as a set of seen intervals. A value missing
between the lowest and highest seen is a gap; out-of-order arrival is not (a late
record fills its hole). A consumer that joins late starts its range at the first
value it sees. Loss after the highest value seen is only visible through the
tap's heartbeat: when a heartbeat says ``next_seq = N`` and, ``grace`` seconds
later, values below N are still missing above the highest seen, they are counted
as ``tail_loss`` (likewise ``last_transport_sequence`` for the transport). A
publisher restart shows up as a new publisher id with totals of its own.

``tap_gaps`` counts every missing ``seq`` (dropped in the tap or lost on the
way); ``transport_gaps`` counts only what ZeroMQ lost, so their difference is what
the tap dropped. Memory is bounded: at most ``max_holes`` holes are remembered per
sequence; beyond that the oldest hole is written off as lost, and a record that
still arrives into it later counts as a duplicate.

Errors. A response record whose outcome is ``error`` is counted by its message
(``response.error``, else ``HTTP <status>``, else ``(no message)``), clipped
to ``ERROR_CHARS`` characters: at most ``MAX_ERROR_MESSAGES`` distinct ones per
publisher, the rest under ``OTHER_ERRORS``. The message is what the record
carries (the frontend's error text or the proxy's reason), never a body.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import attrs

from shadow_proxy.records import wire
from shadow_proxy.records.envelope import OUTCOMES, check_envelope
from shadow_proxy.records.seqs import DEFAULT_MAX_HOLES, SeqTracker

DEFAULT_GRACE_S = 2.0
#: Distinct error messages kept per publisher (and in the totals); the rest are
#: counted under ``OTHER_ERRORS``.
MAX_ERROR_MESSAGES = 8
#: An error message is counted by its first characters.
ERROR_CHARS = 160
OTHER_ERRORS = "(other messages)"


@attrs.define
class PublisherTotals:
    """Totals for one publisher id: one tap socket in one proxy process."""

    publisher_id: int
    max_holes: int = DEFAULT_MAX_HOLES
    tap: str | None = None
    records: int = 0
    responses: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    outcomes: dict[str, int] = attrs.field(factory=dict)
    #: Error records by message (module docstring: bounded).
    errors: dict[str, int] = attrs.field(factory=dict)
    heartbeats: int = 0
    last_heartbeat: wire.Heartbeat | None = None
    seqs: SeqTracker = attrs.field()
    transport: SeqTracker = attrs.field()
    _pending: collections.deque[tuple[float, wire.Heartbeat]] = attrs.field(
        factory=lambda: collections.deque(maxlen=64)
    )

    @seqs.default
    def _seqs_default(self) -> SeqTracker:
        return SeqTracker(max_holes=self.max_holes)

    @transport.default
    def _transport_default(self) -> SeqTracker:
        return SeqTracker(max_holes=self.max_holes)

    def add_record(self, transport_sequence: int, envelope: dict[str, Any]) -> bool:
        """Count one decoded record; False (and nothing counted) if a duplicate."""
        self.transport.observe(transport_sequence)
        if not self.seqs.observe(envelope["seq"]):
            return False
        self.tap = envelope["tap"]
        self.records += 1
        self.prompt_tokens += len(envelope["request"].get("token_ids", ()))
        response = envelope.get("response")
        if response is not None:
            self.responses += 1
            self.output_tokens += response.get("output_tokens", 0)
            outcome = response.get("outcome")
            name = outcome if outcome in OUTCOMES else "unknown"
            self.outcomes[name] = self.outcomes.get(name, 0) + 1
            if name == "error":
                count_error(self.errors, error_message(response))
        return True

    def add_heartbeat(self, heartbeat: wire.Heartbeat, now: float) -> None:
        self.heartbeats += 1
        self.tap = heartbeat.tap
        self.last_heartbeat = heartbeat
        self.seqs.anchor(heartbeat.next_seq)
        last = heartbeat.last_transport_sequence
        self.transport.anchor(0 if last is None else last + 1)
        self._pending.append((now, heartbeat))

    def settle(self, now: float, grace: float) -> None:
        """Let heartbeats older than ``grace`` confirm what was sent."""
        while self._pending and now - self._pending[0][0] >= grace:
            _, heartbeat = self._pending.popleft()
            self.seqs.confirm_end(heartbeat.next_seq)
            if heartbeat.last_transport_sequence is not None:
                self.transport.confirm_end(heartbeat.last_transport_sequence + 1)

    def summary(self) -> dict[str, Any]:
        heartbeat = self.last_heartbeat
        return {
            "publisher_id": self.publisher_id,
            "tap": self.tap,
            "records": self.records,
            "responses": self.responses,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "outcomes": dict(sorted(self.outcomes.items())),
            "errors": _by_count(self.errors),
            "first_seq": self.seqs.first,
            "last_seq": self.seqs.last,
            "tap_gaps": self.seqs.gaps(),
            "tail_loss": self.seqs.tail_loss(),
            "transport_gaps": self.transport.gaps(),
            "transport_tail_loss": self.transport.tail_loss(),
            "duplicates": self.seqs.duplicates,
            "transport_duplicates": self.transport.duplicates,
            "heartbeats": self.heartbeats,
            "last_heartbeat": None
            if heartbeat is None
            else {
                "next_seq": heartbeat.next_seq,
                "last_transport_sequence": heartbeat.last_transport_sequence,
                "queued": heartbeat.queued,
                "published": heartbeat.published,
                "dropped": dict(heartbeat.dropped),
                "publish_errors": heartbeat.publish_errors,
            },
        }


_SUMMED = (
    "records",
    "responses",
    "prompt_tokens",
    "output_tokens",
    "tap_gaps",
    "tail_loss",
    "transport_gaps",
    "transport_tail_loss",
    "duplicates",
    "heartbeats",
)


@attrs.define
class Accounts:
    """Everything one consumer has seen on one topic. Never raises on bad input."""

    #: The record topic (its heartbeats are ``{topic}.heartbeat``); None: any.
    topic: str | None
    grace: float = DEFAULT_GRACE_S
    max_holes: int = DEFAULT_MAX_HOLES
    publishers: dict[int, PublisherTotals] = attrs.field(factory=dict)
    undecodable: dict[str, int] = attrs.field(factory=dict)

    def _reject(self, reason: str) -> None:
        self.undecodable[reason] = self.undecodable.get(reason, 0) + 1

    def _publisher(self, publisher_id: int) -> PublisherTotals:
        totals = self.publishers.get(publisher_id)
        if totals is None:
            totals = PublisherTotals(publisher_id, max_holes=self.max_holes)
            self.publishers[publisher_id] = totals
        return totals

    def on_frames(self, frames: Sequence[bytes], now: float) -> wire.Message | None:
        """Account for one multipart message; the message if it was a new record."""
        # The subscription matches by prefix: compare the topic frame exactly.
        if self.topic is not None and frames and bytes(frames[0]) not in self._topics:
            self._reject("topic")
            return None
        try:
            message = wire.decode_frames(frames)
        except wire.WireError as exc:
            self._reject(exc.reason)
            return None
        if message.topic.endswith(wire.HEARTBEAT_SUFFIX):
            try:
                heartbeat = wire.Heartbeat.decode(message.payload)
            except wire.WireError as exc:
                self._reject(exc.reason)
                return None
            if heartbeat.publisher_id != message.publisher_id:
                self._reject("heartbeat")
                return None
            self.on_heartbeat(message, heartbeat, now)
            return None
        try:
            envelope = wire.decode_envelope(message.payload)
        except wire.WireError as exc:
            self._reject(exc.reason)
            return None
        reason = check_envelope(envelope)
        if reason is not None:
            self._reject(reason)
            return None
        return message if self.on_record(message, envelope) else None

    @property
    def _topics(self) -> tuple[bytes, bytes]:
        topic = self.topic or ""
        return topic.encode("utf-8"), wire.heartbeat_topic(topic).encode("utf-8")

    def on_record(self, message: wire.Message, envelope: dict[str, Any]) -> bool:
        """Count a decoded, checked record; False when it is a duplicate."""
        return self._publisher(message.publisher_id).add_record(message.sequence, envelope)

    def on_heartbeat(self, message: wire.Message, heartbeat: wire.Heartbeat, now: float) -> None:
        self._publisher(message.publisher_id).add_heartbeat(heartbeat, now)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.publishers.values())

    def summary(self, now: float) -> dict[str, Any]:
        """Totals over all publishers, then one entry per publisher."""
        per_publisher = []
        for totals in self.publishers.values():
            totals.settle(now, self.grace)
            per_publisher.append(totals.summary())
        overall: dict[str, Any] = {"topic": self.topic}
        for name in _SUMMED:
            overall[name] = sum(p[name] for p in per_publisher)
        outcomes: dict[str, int] = {}
        for entry in per_publisher:
            for name, count in entry["outcomes"].items():
                outcomes[name] = outcomes.get(name, 0) + count
        overall["outcomes"] = dict(sorted(outcomes.items()))
        errors: dict[str, int] = {}
        for entry in per_publisher:
            for message, count in entry["errors"].items():
                count_error(errors, message, count)
        overall["errors"] = _by_count(errors)
        overall["undecodable"] = dict(sorted(self.undecodable.items()))
        overall["publishers"] = per_publisher
        return overall


def error_message(response: dict[str, Any]) -> str:
    """What an error record says went wrong, clipped to ``ERROR_CHARS``."""
    message = response.get("error")
    if not isinstance(message, str) or not message:
        status = response.get("http_status")
        message = f"HTTP {status}" if isinstance(status, int) else "(no message)"
    return message[:ERROR_CHARS]


def count_error(errors: dict[str, int], message: str, count: int = 1) -> None:
    """Add ``count`` to ``message`` in ``errors``, keeping at most
    ``MAX_ERROR_MESSAGES`` messages besides ``OTHER_ERRORS``."""
    if message not in errors and len(errors.keys() - {OTHER_ERRORS}) >= MAX_ERROR_MESSAGES:
        message = OTHER_ERRORS
    errors[message] = errors.get(message, 0) + count


def _by_count(errors: dict[str, int]) -> dict[str, int]:
    return dict(sorted(errors.items(), key=lambda item: (-item[1], item[0])))
