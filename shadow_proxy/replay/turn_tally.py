"""Closed-loop figures per turn index: what ``shadow-replay --closed-loop``
reports beside the usual tally (``closed_loop.ClosedLoop`` feeds it). Pure.

Per turn index: records, the candidate/primary TTFT and e2e ratios (paired,
p50), the answers' mean lengths on both sides, and the cached share of the
prompt where the candidate reports ``usage.prompt_tokens_details.cached_tokens``;
and how far each later turn's send was from its think time. Memory: the first
``MAX_TURN_SAMPLES`` samples of each kind per turn index (counts stay exact).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import attrs

from shadow_proxy.replay.compare import Observation

MAX_TURN_SAMPLES = 10_000


def _keep(values: list[Any], value: Any) -> None:
    if len(values) < MAX_TURN_SAMPLES:
        values.append(value)


def median(values: list[float]) -> float | None:
    return None if not values else round(statistics.median(values), 4)


def mean(values: list[int] | list[float]) -> float | None:
    return None if not values else round(sum(values) / len(values), 3)


@attrs.define
class _Turn:
    records: int = 0
    ttft: list[float] = attrs.field(factory=list)
    e2e: list[float] = attrs.field(factory=list)
    candidate_tokens: list[int] = attrs.field(factory=list)
    primary_tokens: list[int] = attrs.field(factory=list)
    cached: list[float] = attrs.field(factory=list)


@attrs.define
class TurnTally:
    """Counts per turn index, and the think-time errors."""

    turns: dict[int, _Turn] = attrs.field(factory=lambda: defaultdict(_Turn))
    think_errors_ms: list[float] = attrs.field(factory=list)

    def observe(self, index: int, primary: Observation | None, candidate: Observation) -> None:
        stats = self.turns[index]
        stats.records += 1
        if candidate.output_tokens is not None:
            _keep(stats.candidate_tokens, candidate.output_tokens)
        if primary is not None and primary.output_tokens is not None:
            _keep(stats.primary_tokens, primary.output_tokens)
        if primary is not None and primary.succeeded and candidate.succeeded:
            for mine, theirs, into in (
                (candidate.ttft_ms, primary.ttft_ms, stats.ttft),
                (candidate.e2e_ms, primary.e2e_ms, stats.e2e),
            ):
                if mine is not None and theirs:
                    _keep(into, mine / theirs)
        if candidate.cached_tokens is not None and candidate.prompt_tokens:
            _keep(stats.cached, candidate.cached_tokens / candidate.prompt_tokens)

    def think_error(self, ms: float) -> None:
        """A later turn was sent ``ms`` after (negative: before) its think time."""
        _keep(self.think_errors_ms, ms)

    @property
    def completed(self) -> int:
        return sum(s.records for s in self.turns.values())

    def per_turn(self) -> list[dict[str, Any]]:
        return [
            {
                "turn": index,
                "records": s.records,
                "ttft_ratio_p50": median(s.ttft),
                "e2e_ratio_p50": median(s.e2e),
                "candidate_tokens_mean": mean(s.candidate_tokens),
                "primary_tokens_mean": mean(s.primary_tokens),
                "cached_share_mean": mean(s.cached),
            }
            for index, s in sorted(self.turns.items())
        ]

    def think_summary(self) -> dict[str, Any]:
        errors = sorted(abs(e) for e in self.think_errors_ms)
        return {
            "n": len(errors),
            "p50": None if not errors else round(statistics.median(errors), 3),
            "max": None if not errors else round(errors[-1], 3),
        }
