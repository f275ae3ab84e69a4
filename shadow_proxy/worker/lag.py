"""Record lag: how long after it was ready a record leaves, and when it is too late.

Pure (no sockets). A record is *ready* when the serving loop has sent the last
hand-off message it needs: for ``capture: request`` taps the request's arrival
(the ``q`` message goes out as soon as the body is read), for joined taps the
response's end (``arrival + end offset``, from the ``e`` message). Arrival
stamps are the serving process's ``CLOCK_MONOTONIC``, which is system-wide,
so the worker's processes subtract them from their own clock.

``shadow_tap_record_lag_seconds{tap}`` is observed by the worker's main when a
record is sent. Past ``worker.max_lag_s`` a request is given up instead of
processed late, at the first cheap point that sees it (each a counted drop,
reason ``late``, its seq taken; ``shadow_worker_late_total{stage}``):

- ``intake``: a ``q`` older than the bound is not preprocessed (the main checks
  when it routes it, the shard again when it reads it); every tap counts it;
- ``end``: at an ``e`` older than the bound, joined taps' records are not built;
- ``queue``: a queued record older than the bound is not sent.

Records already in a subscriber's ZeroMQ pipe cannot be recalled: past the
send, lag is the consumer's own (visible in the frame's ``published_at``).
"""

from __future__ import annotations

import enum

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram

from shadow_proxy.channel import tally

#: Record lag buckets, 1 ms to 10 minutes.
LAG_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
)  # fmt: skip


class LateStage(enum.StrEnum):
    """Where a request or record too old was given up (``shadow_worker_late_total``)."""

    INTAKE = "intake"
    END = "end"
    QUEUE = "queue"


@attrs.frozen
class LagBound:
    """``worker.max_lag_s`` in the clock's units; None: no bound."""

    max_lag_ns: int | None

    @classmethod
    def from_seconds(cls, seconds: float | None) -> LagBound:
        return cls(None if seconds is None else int(seconds * 1e9))

    def late(self, ready_mono_ns: int, now_ns: int) -> bool:
        return self.max_lag_ns is not None and now_ns - ready_mono_ns > self.max_lag_ns


def record_lag_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "shadow_tap_record_lag_seconds",
        "From when a record was ready (request arrival; joined taps: the response's end) "
        "to its send on the tap's socket.",
        ["tap"],
        buckets=LAG_BUCKETS,
        registry=registry,
    )


def intake_lag_histogram(on: tally.Tally) -> tally.Histogram:
    """On a shard's tally (a shard observes it)."""
    return on.histogram(
        "shadow_worker_intake_lag_seconds",
        "How old a request was when the worker started on it (the worker falling behind).",
        buckets=LAG_BUCKETS,
    )


_LATE = (
    "shadow_worker_late",
    "Requests or records given up because they were older than worker.max_lag_s, by stage.",
    ["stage"],
)


def late_counter(registry: CollectorRegistry) -> Counter:
    """On the main's registry (stage ``queue``)."""
    counter = Counter(*_LATE, registry=registry)
    for stage in LateStage:
        counter.labels(stage)
    return counter


def shard_late_counter(on: tally.Tally) -> tally.Counter:
    """On a shard's tally (stages ``intake`` and ``end``); the main's and the
    shards' are one family, summed (``channel/families.py``)."""
    counter = on.counter(*_LATE)
    for stage in LateStage:
        counter.labels(stage)
    return counter
