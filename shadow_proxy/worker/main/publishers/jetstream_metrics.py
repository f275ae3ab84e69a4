"""The JetStream taps' own metrics, beside the per-tap counters every tap has.

Written by the publisher's thread (plain integers, one writer each), read by
the worker's thread when it collects its snapshot each second; the collector
is registered on the worker's registry, so the serving process relays these
families like the others. Label values are tap names (from the
configuration) and fixed reason words, never client input.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

import attrs
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

#: From a publish to its acknowledgement, retries included: a healthy stream
#: answers in milliseconds, a leader election takes seconds, an outage minutes.
ACK_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)

#: Why the taps could not publish to the stream (``shadow_nats_stream_problems``).
#: A real mismatch, that an operator must fix (``MISMATCHES``): the stream does
#: not cover a tap's subject, JetStream refused to create it, or it vanished
#: (and was created again, empty). A transient no-answer, that a stream leader
#: election or a server restart causes and that passes by itself
#: (``NO_ANSWERS``): JetStream did not answer a stream check, or a publish got
#: no answer from the stream (the stream is then checked again).
MISMATCHES = ("subjects", "refused", "missing")
NO_ANSWERS = ("unavailable", "no_answer")
STREAM_PROBLEMS = (*MISMATCHES, *NO_ANSWERS)


@attrs.define
class AckHistogram:
    """A histogram without locks: one thread observes, another reads."""

    counts: list[int] = attrs.field(factory=lambda: [0] * (len(ACK_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(ACK_BUCKETS, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, int]]:
        out, running = [], 0
        counts = list(self.counts)
        for bound, count in zip((*ACK_BUCKETS, float("inf")), counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else str(bound), running))
        return out


@attrs.define
class TapStats:
    """One JetStream tap's numbers beyond the queue's (``in_flight`` is read from
    its publisher: records handed over and not settled)."""

    tap: str
    ack_seconds: AckHistogram = attrs.field(factory=AckHistogram)
    retries: int = 0


@attrs.define
class LinkStats:
    """The connection's numbers."""

    connected: bool = False
    reconnects: int = 0
    #: Connections a server refused (credentials, TLS, permissions): tried again.
    refusals: int = 0
    stream_problems: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(STREAM_PROBLEMS, 0))


class HasStats(Protocol):
    stats: TapStats

    @property
    def in_flight(self) -> int: ...


class JetStreamMetrics(Collector):
    """Yields the JetStream families from the stats the publisher thread keeps."""

    def __init__(self, link: LinkStats, publishers: Sequence[HasStats]):
        self.link = link
        self.publishers = publishers

    def collect(self):
        ack = HistogramMetricFamily(
            "shadow_tap_ack_seconds",
            "From a record's first publish to JetStream's acknowledgement (retries included).",
            labels=["tap"],
        )
        retries = CounterMetricFamily(
            "shadow_tap_publish_retries",
            "Publishes sent again with the same Nats-Msg-Id (no acknowledgement in time, "
            "an error, or a new connection).",
            labels=["tap"],
        )
        awaiting = GaugeMetricFamily(
            "shadow_tap_awaiting_ack",
            "Records handed to JetStream and not acknowledged yet (at most the tap's capacity).",
            labels=["tap"],
        )
        for publisher in self.publishers:
            tap = publisher.stats
            ack.add_metric([tap.tap], tap.ack_seconds.buckets(), tap.ack_seconds.total)
            retries.add_metric([tap.tap], tap.retries)
            awaiting.add_metric([tap.tap], publisher.in_flight)
        connected = GaugeMetricFamily(
            "shadow_nats_connected", "1 while the tap worker is connected to a NATS server."
        )
        connected.add_metric([], 1.0 if self.link.connected else 0.0)
        reconnects = CounterMetricFamily(
            "shadow_nats_reconnects", "Connections to NATS made again after one was lost."
        )
        reconnects.add_metric([], self.link.reconnects)
        refusals = CounterMetricFamily(
            "shadow_nats_refusals",
            "Times a NATS server refused the tap worker (authorization, TLS verification, "
            "permissions); the worker keeps serving and tries again.",
        )
        refusals.add_metric([], self.link.refusals)
        problems = CounterMetricFamily(
            "shadow_nats_stream_problems",
            "Times the JetStream taps could not publish to the stream, by reason. A "
            "mismatch to fix: subjects (the stream does not cover a tap's subject), refused "
            "(JetStream would not create it), missing (it vanished and was created again). "
            "A transient no-answer (a leader election): unavailable (a stream check got no "
            "answer), no_answer (a publish got none; the stream is checked again).",
            labels=["reason"],
        )
        for reason, count in self.link.stream_problems.items():
            problems.add_metric([reason], count)
        return [ack, retries, awaiting, connected, reconnects, refusals, problems]

    def describe(self):
        return []
