"""The worker main's own metrics: the taps' counters, read from the tap queues at
collection time (so they never go out of step with what the queues counted).

On the main's registry, with the record lag, the late drops, the pool's and the
JetStream link's metrics; the main reports them, combined with its shards'
(``channel/families.py``), to the serving process every second.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shadow_proxy.worker.main.tap_queue import TapQueue


class TapMetrics(Collector):
    """``shadow_tap_*`` per tap: queued, published, dropped and skipped by reason,
    publish errors, queue depth."""

    def __init__(self, queues: Sequence[TapQueue]):
        self.queues = queues

    def collect(self) -> Iterable[Metric]:
        labels = ["tap"]
        queued = CounterMetricFamily(
            "shadow_tap_queued", "Records put on the tap's queue.", labels=labels
        )
        published = CounterMetricFamily(
            "shadow_tap_published", "Records sent on the tap's socket.", labels=labels
        )
        dropped = CounterMetricFamily(
            "shadow_tap_dropped", "Records lost, by reason.", labels=["tap", "reason"]
        )
        errors = CounterMetricFamily(
            "shadow_tap_publish_errors", "Sends that failed.", labels=labels
        )
        skipped = CounterMetricFamily(
            "shadow_tap_skipped",
            "Requests the tap did not take (filters, sample, models): not a loss.",
            labels=["tap", "reason"],
        )
        depth = GaugeMetricFamily("shadow_tap_queue_depth", "Records waiting.", labels=labels)
        for q in self.queues:
            name = q.name
            queued.add_metric([name], q.queued)
            published.add_metric([name], q.published)
            errors.add_metric([name], q.publish_errors)
            depth.add_metric([name], len(q.items))
            for reason, n in q.dropped.items():
                dropped.add_metric([name, reason], n)
            for reason, n in q.skipped.items():
                skipped.add_metric([name, reason], n)
        return [queued, published, dropped, errors, skipped, depth]
