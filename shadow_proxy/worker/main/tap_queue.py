"""One tap's bounded queue, its ``seq`` and its loss counters (no sockets here).

``take_seq`` is called before ``offer``, so a record that is dropped leaves a
gap in ``seq`` that a consumer can count. ``offer`` never blocks: a full queue
drops the record and counts ``full``. Every other loss the worker can see is
counted through ``drop`` with its own reason.
"""

from __future__ import annotations

import collections

import attrs

from shadow_proxy.config import TapConfig

#: Reasons a tap loses a record. ``full``: its queue is at capacity (the
#: consumer is slow or stopped). ``closed``: the publisher is gone (shutdown
#: deadline passed, socket closed). ``handoff_full``: the serving loop could
#: not hand the request or its response to the worker. ``evicted``: the
#: worker tracked too many unfinished requests and gave up on the oldest.
#: ``encode_error``: the record could not be encoded. ``projection_error``:
#: this tap's filters failed on the request (e.g. input nested too deep).
#: ``late``: the request or record was older than ``worker.max_lag_s``
#: (``worker/lag.py``). ``worker_died``: the worker process (or the shard)
#: that held the request died or was stopped before its record existed.
#: ``worker_error``: handling the request failed (a bug) before this tap's
#: record existed.
DROP_REASONS = (
    "full", "closed", "handoff_full", "evicted", "encode_error", "projection_error", "late",
    "worker_died", "worker_error",
)  # fmt: skip


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
    closed: bool = False

    @property
    def name(self) -> str:
        return self.config.name

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def offer(self, payload: bytes, ready_mono_ns: int = 0) -> bool:
        """Queue an encoded envelope; never blocks. False when dropped (counted)."""
        if self.closed:
            self.dropped["closed"] += 1
            return False
        if len(self.items) >= self.config.capacity:
            self.dropped["full"] += 1
            return False
        self.items.append(payload)
        self.ready.append(ready_mono_ns)
        self.queued += 1
        return True

    def popleft(self) -> tuple[bytes, int]:
        """The oldest queued record and when it was ready."""
        return self.items.popleft(), self.ready.popleft()

    def drop(self, reason: str, count: int = 1) -> None:
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
        self.dropped["closed"] += lost
        self.items.clear()
        self.ready.clear()
        return lost
