"""Totals over a replay, percentiles, bootstrap intervals and the verdicts.

Pure (numpy, no socket, no clock). ``Tally.add`` runs once per finished pair,
``Tally.skip`` once per record not sent, ``Tally.summary`` when the report is
written (at the end, or on Ctrl-C with what was done).

Counters are exact. Latencies and divergence positions are kept per pair in
float64 columns, at most ``max_samples`` rows (12 columns, 96 bytes a row:
9.6 MB at the default 100,000); past that a uniform reservoir sample (seeded)
stands for all pairs and the summary says ``sampled: true``.

Latency verdicts. A ratio is a p50 over a p50 (``ratio_p50``); its 95%
interval comes from a paired bootstrap over requests (the same resampled
requests for both sides, ``BOOTSTRAP_ROUNDS`` rounds, fixed seed, on the pairs
where both sides have the value). Without a baseline the verdict is on the
candidate/primary ratio; with one it is on candidate/baseline (Diffy's noise
floor: the primary's latencies were measured at the proxy, the candidate's and
the baseline's by this replayer under the same schedule, so what the baseline
shows against the primary is measurement and noise, not change). A difference
counts only when the whole interval lies outside [1/(1+t), 1+t], t being
``tolerance`` (default 0.05), and the two p50s differ by at least
``min_diff_ms`` (default 1 ms; as Diffy's absolute threshold beside its
relative one: a ratio of near-zero latencies, e.g. the inter-token latency of
an engine that sends its tokens in bursts, is noise however large):
``higher`` or ``lower``, else ``no_difference``.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from shadow_proxy.replay.compare import (
    DEFAULT_MAX_SAMPLES,
    DEFAULT_MIN_DIFF_MS,
    DEFAULT_TOLERANCE,
    JUDGED_FIELDS,
    Difference,
    Observation,
    counted,
    differs,
)

PERCENTILES = (50, 90, 99)
BOOTSTRAP_ROUNDS = 1000
CONFIDENCE = 0.95
METRICS = ("ttft_ms", "itl_ms", "e2e_ms")
SIDES = ("primary", "candidate", "baseline")
#: Sample columns: every metric for every side, then divergence positions.
COLUMNS = (
    *(f"{m}.{s}" for m in METRICS for s in SIDES),
    "divergence.candidate",
    "divergence.baseline",
    "divergence_choice.candidate",
)


def percentiles(values: Sequence[float] | np.ndarray) -> dict[str, float] | None:
    """p50, p90, p99 (linear interpolation), NaNs ignored; None without values."""
    data = np.asarray(values, dtype=float)
    data = data[~np.isnan(data)]
    if data.size == 0:
        return None
    points = np.percentile(data, PERCENTILES)
    return {f"p{q}": round(float(v), 3) for q, v in zip(PERCENTILES, points, strict=True)}


def bootstrap_ratio(
    numerator: np.ndarray, denominator: np.ndarray, *, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0
) -> tuple[float, float] | None:
    """95% interval of p50(numerator)/p50(denominator), resampling pairs; None
    with fewer than 2 complete pairs."""
    keep = ~(np.isnan(numerator) | np.isnan(denominator))
    num, den = numerator[keep], denominator[keep]
    n = num.size
    if n < 2:
        return None
    rng = np.random.default_rng(seed)
    block = max(1, min(rounds, 2_000_000 // n))
    ratios: list[np.ndarray] = []
    done = 0
    while done < rounds:
        size = min(block, rounds - done)
        idx = rng.integers(0, n, size=(size, n))
        top = np.median(num[idx], axis=1)
        bottom = np.median(den[idx], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios.append(top / bottom)
        done += size
    values = np.concatenate(ratios)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(values, (tail, 100 - tail))
    return float(lo), float(hi)


def verdict(
    interval: tuple[float, float] | None,
    tolerance: float,
    difference_ms: float | None = None,
    min_diff_ms: float = 0.0,
) -> str:
    """``higher``/``lower`` when the whole interval is beyond the tolerance band
    and the p50s differ by at least ``min_diff_ms``; ``no_difference``
    otherwise; ``unknown`` without an interval."""
    if interval is None:
        return "unknown"
    if difference_ms is not None and abs(difference_ms) < min_diff_ms:
        return "no_difference"
    lo, hi = interval
    if lo > 1 + tolerance:
        return "higher"
    if hi < 1 / (1 + tolerance):
        return "lower"
    return "no_difference"


@attrs.define
class Samples:
    """Per-pair values in float64 columns, a seeded reservoir past ``max_samples``."""

    max_samples: int = DEFAULT_MAX_SAMPLES
    seen: int = 0
    columns: dict[str, array] = attrs.field(factory=lambda: {c: array("d") for c in COLUMNS})
    _rng: random.Random = attrs.field(factory=lambda: random.Random(0))

    def add(self, row: dict[str, float | None]) -> None:
        self.seen += 1
        values = [float("nan") if row.get(c) is None else float(row[c]) for c in COLUMNS]
        if self.seen <= self.max_samples:
            for name, value in zip(COLUMNS, values, strict=True):
                self.columns[name].append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.max_samples:
            for name, value in zip(COLUMNS, values, strict=True):
                self.columns[name][slot] = value

    @property
    def sampled(self) -> bool:
        return self.seen > self.max_samples

    def column(self, name: str) -> np.ndarray:
        return (
            np.frombuffer(self.columns[name], dtype=float) if self.columns[name] else np.array([])
        )


@attrs.define
class FieldCounts:
    """One judged field: candidate differs, baseline differs too (noise), counted."""

    differs: int = 0
    noise: int = 0
    counted: int = 0


@attrs.define
class Tally:
    """Everything the summary needs, fed pair by pair."""

    has_baseline: bool = False
    tolerance: float = DEFAULT_TOLERANCE
    min_diff_ms: float = DEFAULT_MIN_DIFF_MS
    samples: Samples = attrs.field(factory=Samples)
    records: int = 0
    replayed: int = 0
    skipped: dict[str, int] = attrs.field(factory=dict)
    errors: int = 0
    errors_by_status: dict[str, int] = attrs.field(factory=dict)
    baseline_errors: int = 0
    compared: int = 0
    exact_matches: int = 0
    by_basis: dict[str, int] = attrs.field(factory=dict)
    prompt_token_mismatches: int = 0
    baseline_prompt_token_mismatches: int = 0
    fields: dict[str, FieldCounts] = attrs.field(
        factory=lambda: {f: FieldCounts() for f in JUDGED_FIELDS}
    )

    def skip(self, reason: str) -> None:
        self.records += 1
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def add(
        self,
        primary: Observation | None,
        candidate: Observation,
        diff: Difference | None,
        baseline: Observation | None = None,
        baseline_diff: Difference | None = None,
    ) -> dict[str, bool] | None:
        """Count one replayed request; returns the judged fields that count
        (None when not compared, as with ``--no-compare``)."""
        self.records += 1
        self.replayed += 1
        if candidate.error is not None:
            self.errors += 1
            key = str(candidate.http_status or "connection")
            self.errors_by_status[key] = self.errors_by_status.get(key, 0) + 1
        if baseline is not None and baseline.error is not None:
            self.baseline_errors += 1
        row: dict[str, float | None] = {}
        for metric in METRICS:
            row[f"{metric}.candidate"] = getattr(candidate, metric)
            if primary is not None:
                row[f"{metric}.primary"] = getattr(primary, metric)
            if baseline is not None:
                row[f"{metric}.baseline"] = getattr(baseline, metric)
        if diff is None:
            self.samples.add(row)
            return None
        if diff.prompt_tokens_differ:
            self.prompt_token_mismatches += 1
        if baseline_diff is not None and baseline_diff.prompt_tokens_differ:
            self.baseline_prompt_token_mismatches += 1
        self.by_basis[diff.basis] = self.by_basis.get(diff.basis, 0) + 1
        if diff.output_equal is not None:
            self.compared += 1
            self.exact_matches += diff.output_equal
        if diff.divergence is not None:
            row["divergence.candidate"] = diff.divergence.position
            row["divergence_choice.candidate"] = diff.divergence.choice
        if baseline_diff is not None and baseline_diff.divergence is not None:
            row["divergence.baseline"] = baseline_diff.divergence.position
        self.samples.add(row)
        judged = counted(diff, baseline_diff)
        for name, counts in self.fields.items():
            if differs(diff, name):
                counts.differs += 1
                counts.noise += not judged[name]
                counts.counted += judged[name]
        return judged

    def latency(self, metric: str) -> dict[str, Any]:
        col = {s: self.samples.column(f"{metric}.{s}") for s in SIDES}
        out: dict[str, Any] = {s: percentiles(col[s]) for s in SIDES[:2]}
        p, c, b = out["primary"], out["candidate"], None
        out["ratio_p50"] = _ratio(c, p)
        out["ratio_p50_ci95"] = _interval(bootstrap_ratio(col["candidate"], col["primary"]))
        if not self.has_baseline:
            out["verdict"] = verdict(
                out["ratio_p50_ci95"], self.tolerance, _diff(c, p), self.min_diff_ms
            )
            out["judged_against"] = "primary"
            return out
        out["baseline"] = b = percentiles(col["baseline"])
        out["baseline_ratio_p50"] = _ratio(b, p)
        out["baseline_ratio_p50_ci95"] = _interval(bootstrap_ratio(col["baseline"], col["primary"]))
        out["candidate_vs_baseline_p50"] = _ratio(c, b)
        vs = bootstrap_ratio(col["candidate"], col["baseline"])
        out["candidate_vs_baseline_ci95"] = _interval(vs)
        out["verdict"] = verdict(vs, self.tolerance, _diff(c, b), self.min_diff_ms)
        out["judged_against"] = "baseline"
        return out

    def summary(self) -> dict[str, Any]:
        positions = self.samples.column("divergence.candidate")
        out: dict[str, Any] = {
            "records": self.records,
            "replayed": self.replayed,
            "skipped": dict(sorted(self.skipped.items())),
            "errors": self.errors,
            "errors_by_status": dict(sorted(self.errors_by_status.items())),
            "compared": self.compared,
            "exact_match_rate": round(self.exact_matches / self.compared, 6)
            if self.compared
            else None,
            "output_basis": dict(sorted(self.by_basis.items())),
            "prompt_token_mismatches": self.prompt_token_mismatches,
            "first_divergence": percentiles(positions),
            "differences": {name: attrs.asdict(c) for name, c in self.fields.items()},
            **{metric: self.latency(metric) for metric in METRICS},
            "tolerance": self.tolerance,
            "min_diff_ms": self.min_diff_ms,
            "sampled": self.samples.sampled,
        }
        if self.has_baseline:
            out["baseline_errors"] = self.baseline_errors
            out["baseline_prompt_token_mismatches"] = self.baseline_prompt_token_mismatches
        return out


def _ratio(top: dict[str, float] | None, bottom: dict[str, float] | None) -> float | None:
    if top is None or bottom is None or bottom["p50"] <= 0:
        return None
    return round(top["p50"] / bottom["p50"], 4)


def _diff(top: dict[str, float] | None, bottom: dict[str, float] | None) -> float | None:
    return None if top is None or bottom is None else top["p50"] - bottom["p50"]


def _interval(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [round(interval[0], 4), round(interval[1], 4)]
