"""A shard's metrics: the joiner's, on the shard's tally (``channel/tally.py``:
kept as the plain data a report carries, so a report costs its encoding alone).

The shard reports them to the worker's main (``worker/messages.py``
``Metrics``), which combines every shard's with its own
(``channel/families.py``) and reports them to the serving process's
``/metrics``. The taps' counters are the main's (``worker/main/metrics.py``).
"""

from __future__ import annotations

from shadow_proxy.channel.tally import Tally
from shadow_proxy.metrics import LATENCY_BUCKETS

PREPROCESS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class JoinerMetrics:
    """The joiner's metrics, on ``tally`` (a fresh one by default)."""

    def __init__(self, tally: Tally | None = None):
        self.tally = tally = Tally() if tally is None else tally
        self.preprocess_seconds = tally.histogram(
            "shadow_preprocess_seconds",
            "Time to rebuild the preprocessed request (template and tokenizer).",
            ["route"],
            buckets=PREPROCESS_BUCKETS,
        )
        self.not_mirrored = tally.counter(
            "shadow_not_mirrored",
            "Mirrored-route requests that yield no record, by reason.",
            ["reason"],
        )
        self.prompt_checks = tally.counter(
            "shadow_prompt_token_checks",
            "Responses whose usage.prompt_tokens was compared with the rebuilt prompt.",
            ["model"],
        )
        self.prompt_mismatches = tally.counter(
            "shadow_prompt_token_mismatches",
            "Responses whose usage.prompt_tokens differs from the rebuilt prompt length.",
            ["model"],
        )
        self.failures = tally.counter(
            "shadow_worker_failures",
            "Hand-off messages the worker could not process, by exception type (a bug).",
            ["exception"],
        )
        self.evicted = tally.counter(
            "shadow_worker_evicted",
            "Unfinished requests the worker stopped tracking (worker.max_in_flight).",
        )
        self.ttft = tally.histogram(
            "shadow_worker_record_ttft_seconds",
            "Arrival to the first content-carrying chunk, in joined records.",
            buckets=LATENCY_BUCKETS,
        )
