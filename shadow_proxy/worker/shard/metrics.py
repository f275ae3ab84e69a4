"""A shard's metrics: the joiner's, on the shard's own registry.

The shard reports them to the worker's main (``worker/messages.py``
``Metrics``), which combines every shard's with its own
(``channel/families.py``) and reports them to the serving process's
``/metrics``. The taps' counters are the main's (``worker/main/metrics.py``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from shadow_proxy.metrics import LATENCY_BUCKETS

PREPROCESS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class JoinerMetrics:
    """The joiner's metrics, on ``registry`` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = CollectorRegistry() if registry is None else registry
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
