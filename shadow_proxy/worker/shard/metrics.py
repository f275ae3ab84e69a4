"""The tap worker's metrics, on the worker's own registry.

``snapshot`` turns them into plain data once a second; the serving process
re-exports the latest snapshot on its ``/metrics`` (``channel/control.py``,
``serving/metrics.py``). Per-tap counters are read from the tap queues at
collection time, so they never go out of step with what the queues counted.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shadow_proxy.channel.control import Family
from shadow_proxy.metrics import LATENCY_BUCKETS
from shadow_proxy.worker.main.tap_queue import TapQueue

PREPROCESS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class WorkerMetrics(Collector):
    """The worker's metrics; the snapshot is relayed to the serving process."""

    def __init__(self, queues: list[TapQueue]):
        self.queues = queues
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.preprocess_seconds = Histogram(
            "shadow_preprocess_seconds",
            "Time to rebuild the preprocessed request (template and tokenizer).",
            ["route"],
            buckets=PREPROCESS_BUCKETS,
            registry=self.registry,
        )
        self.not_mirrored = Counter(
            "shadow_not_mirrored",
            "Mirrored-route requests that yield no record, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.prompt_checks = Counter(
            "shadow_prompt_token_checks",
            "Responses whose usage.prompt_tokens was compared with the rebuilt prompt.",
            ["model"],
            registry=self.registry,
        )
        self.prompt_mismatches = Counter(
            "shadow_prompt_token_mismatches",
            "Responses whose usage.prompt_tokens differs from the rebuilt prompt length.",
            ["model"],
            registry=self.registry,
        )
        self.failures = Counter(
            "shadow_worker_failures",
            "Hand-off messages the worker could not process, by exception type (a bug).",
            ["exception"],
            registry=self.registry,
        )
        self.evicted = Counter(
            "shadow_worker_evicted",
            "Unfinished requests the worker stopped tracking (worker.max_in_flight).",
            registry=self.registry,
        )
        self.ttft = Histogram(
            "shadow_worker_record_ttft_seconds",
            "Arrival to the first content-carrying chunk, in joined records.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def collect(self):
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

    def snapshot(self) -> list[Family]:
        """The registry's samples as plain data for the relay."""
        return [
            [family.name, family.type, family.documentation,
             [[s.name, s.labels, s.value] for s in family.samples]]
            for family in self.registry.collect()
        ]  # fmt: skip
