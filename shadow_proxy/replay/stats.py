"""Totals over a replay, percentiles and the summary with its verdicts.

Pure (numpy, no socket, no clock). ``Tally.add`` runs once per finished pair,
``Tally.skip`` once per record not sent, ``Tally.summary`` when the report is
written (at the end, or on Ctrl-C with what was done).

Counters are exact. Latencies and divergence positions are kept per pair in
float64 columns, at most ``max_samples`` rows (12 columns, 96 bytes a row:
9.6 MB at the default 100,000); past that a uniform reservoir sample (seeded)
stands for all pairs and the summary says ``sampled: true``.

Latencies are kept for successful answers only (``Observation.succeeded``): a
failed side's cell is NaN, so every ratio is computed on the pairs where both
sides answered and have the value, and every figure carries its ``n``. The
verdicts are ``verdicts.judge``'s: without a baseline on candidate/primary,
with one on candidate/baseline (Diffy's noise floor: the baseline is the
primary's build, measured by this replayer under the same schedule as the
candidate, so what it shows against the primary is measurement and noise, not
change). Past ``max_error_rate`` failed requests, on either target, no
verdict is given.

Failures are counted per target by ``Observation.error_key`` (the HTTP status,
``connection``, ``timeout`` or ``stream``), with the first
``ERROR_EXAMPLES`` distinct messages kept as examples.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from shadow_proxy.replay.compare import (
    JUDGED_FIELDS,
    Difference,
    Observation,
    counted,
    differs,
)
from shadow_proxy.replay.verdicts import (
    DEFAULT_MAX_ERROR_RATE,
    DEFAULT_MIN_DIFF_MS,
    DEFAULT_TOLERANCE,
    MIN_PAIRS,
    bootstrap_ratio,
    failure,
    judge,
    ratio_of_medians,
)

#: Latency samples kept per deployment (a reservoir sample past this).
DEFAULT_MAX_SAMPLES = 100_000
#: Distinct error messages kept per target as examples.
ERROR_EXAMPLES = 5
PERCENTILES = (50, 90, 99)
METRICS = ("ttft_ms", "itl_ms", "e2e_ms")
SIDES = ("primary", "candidate", "baseline")
#: Summary keys (ratio, interval, n) of the candidate/primary,
#: baseline/primary and candidate/baseline ratios.
PRIMARY_KEYS = ("ratio_p50", "ratio_p50_ci95", "n")
BASELINE_KEYS = ("baseline_ratio_p50", "baseline_ratio_p50_ci95", "baseline_n")
VERSUS_BASELINE_KEYS = (
    "candidate_vs_baseline_p50",
    "candidate_vs_baseline_ci95",
    "candidate_vs_baseline_n",
)
#: Sample columns: every metric for every side, then divergence positions.
COLUMNS = (
    *(f"{m}.{s}" for m in METRICS for s in SIDES),
    "divergence.candidate",
    "divergence.baseline",
    "divergence_choice.candidate",
)


def percentiles(values: Sequence[float] | np.ndarray) -> dict[str, float] | None:
    """p50, p90, p99 (linear interpolation) and ``n``, NaNs ignored; None without values."""
    data = np.asarray(values, dtype=float)
    data = data[~np.isnan(data)]
    if data.size == 0:
        return None
    points = np.percentile(data, PERCENTILES)
    out: dict[str, float] = {
        f"p{q}": round(float(v), 3) for q, v in zip(PERCENTILES, points, strict=True)
    }
    out["n"] = int(data.size)
    return out


def positions(values: Sequence[float] | np.ndarray) -> dict[str, int] | None:
    """p50, p90, p99 and ``n`` of whole positions: each one a position that
    occurred (no interpolation: a position is an integer); None without values."""
    data = np.asarray(values, dtype=float)
    data = data[~np.isnan(data)]
    if data.size == 0:
        return None
    points = np.percentile(data, PERCENTILES, method="inverted_cdf")
    out = {f"p{q}": int(v) for q, v in zip(PERCENTILES, points, strict=True)}
    out["n"] = int(data.size)
    return out


@attrs.define
class Samples:
    """Per-pair values in float64 columns, a seeded reservoir past ``max_samples``."""

    max_samples: int = DEFAULT_MAX_SAMPLES
    seen: int = 0
    columns: dict[str, array] = attrs.field(factory=lambda: {c: array("d") for c in COLUMNS})
    _rng: random.Random = attrs.field(factory=lambda: random.Random(0))

    def add(self, row: dict[str, float | None]) -> None:
        self.seen += 1
        values = [float("nan") if (v := row.get(c)) is None else float(v) for c in COLUMNS]
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
class TargetErrors:
    """One target's failed requests: by key, and the first distinct messages."""

    total: int = 0
    by_status: dict[str, int] = attrs.field(factory=dict)
    examples: list[dict[str, str]] = attrs.field(factory=list)

    def add(self, observation: Observation) -> None:
        key = observation.error_key
        self.total += 1
        self.by_status[key] = self.by_status.get(key, 0) + 1
        message = observation.error or ""
        if len(self.examples) < ERROR_EXAMPLES and all(
            e["message"] != message for e in self.examples
        ):
            self.examples.append({"status": key, "message": message})


@attrs.define
class Tally:
    """Everything the summary needs, fed pair by pair."""

    has_baseline: bool = False
    tolerance: float = DEFAULT_TOLERANCE
    min_diff_ms: float = DEFAULT_MIN_DIFF_MS
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    min_pairs: int = MIN_PAIRS
    samples: Samples = attrs.field(factory=Samples)
    records: int = 0
    replayed: int = 0
    skipped: dict[str, int] = attrs.field(factory=dict)
    candidate_errors: TargetErrors = attrs.field(factory=TargetErrors)
    baseline_errors: TargetErrors = attrs.field(factory=TargetErrors)
    #: Replayed records whose primary had failed (the record's outcome).
    primary_failed: int = 0
    compared: int = 0
    exact_matches: int = 0
    by_basis: dict[str, int] = attrs.field(factory=dict)
    prompt_token_mismatches: int = 0
    baseline_prompt_token_mismatches: int = 0
    #: Primary records by where their latencies start (``compare.TIMED_FROM``).
    primary_timed_from: dict[str, int] = attrs.field(factory=dict)
    fields: dict[str, FieldCounts] = attrs.field(
        factory=lambda: {f: FieldCounts() for f in JUDGED_FIELDS}
    )

    @property
    def errors(self) -> int:
        """The candidate's failed requests."""
        return self.candidate_errors.total

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
        if not candidate.succeeded:
            self.candidate_errors.add(candidate)
        if baseline is not None and not baseline.succeeded:
            self.baseline_errors.add(baseline)
        if primary is not None:
            self.primary_failed += not primary.succeeded
            if primary.timed_from is not None:
                key = primary.timed_from
                self.primary_timed_from[key] = self.primary_timed_from.get(key, 0) + 1
        row: dict[str, float | None] = {}
        for side, seen in (("candidate", candidate), ("primary", primary), ("baseline", baseline)):
            if seen is not None and seen.succeeded:  # a failed answer has no latency
                for metric in METRICS:
                    row[f"{metric}.{side}"] = getattr(seen, metric)
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

    def failed(self) -> str | None:
        """Why no latency verdict stands (too many failures), or None."""
        gates = [failure(self.errors, self.replayed, "candidate", self.max_error_rate)]
        if self.has_baseline:
            gates.append(
                failure(self.baseline_errors.total, self.replayed, "baseline", self.max_error_rate)
            )
        reasons = [g for g in gates if g is not None]
        return "; ".join(reasons) if reasons else None

    def latency(self, metric: str) -> dict[str, Any]:
        """One metric's percentiles per side, paired ratios with their
        intervals and ``n``, and the verdict (``judged``)."""
        col = {s: self.samples.column(f"{metric}.{s}") for s in SIDES}
        reference = "baseline" if self.has_baseline else "primary"
        judgement = judge(
            col["candidate"],
            col[reference],
            reference_name=reference,
            tolerance=self.tolerance,
            min_diff_ms=self.min_diff_ms,
            failed=self.failed(),
            min_pairs=self.min_pairs,
        )
        judged = judgement.to_json()
        versus_judged = (judged["ratio_p50"], judged["ci95"], judged["n"])
        out: dict[str, Any] = {s: percentiles(col[s]) for s in SIDES[:2]}
        if self.has_baseline:
            out.update(_paired(PRIMARY_KEYS, col["candidate"], col["primary"]))
            out["baseline"] = percentiles(col["baseline"])
            out.update(_paired(BASELINE_KEYS, col["baseline"], col["primary"]))
            out.update(zip(VERSUS_BASELINE_KEYS, versus_judged, strict=True))
        else:
            out.update(zip(PRIMARY_KEYS, versus_judged, strict=True))
        out["judged"] = judged
        out["judged_against"] = reference
        out["verdict"] = judgement.verdict
        return out

    def summary(self) -> dict[str, Any]:
        basis = dict(sorted(self.by_basis.items()))
        out: dict[str, Any] = {
            "records": self.records,
            "replayed": self.replayed,
            "skipped": dict(sorted(self.skipped.items())),
            "errors": self.errors,
            "errors_by_status": dict(sorted(self.candidate_errors.by_status.items())),
            "error_examples": list(self.candidate_errors.examples),
            "primary_failed": self.primary_failed,
            "compared": self.compared,
            "exact_match_rate": round(self.exact_matches / self.compared, 6)
            if self.compared
            else None,
            "output_basis": basis,
            "not_compared": {
                "failed": basis.get("error", 0),
                "no_common_basis": basis.get("none", 0),
            },
            "prompt_token_mismatches": self.prompt_token_mismatches,
            "first_divergence": positions(self.samples.column("divergence.candidate")),
            "differences": {name: attrs.asdict(c) for name, c in self.fields.items()},
            "primary_timed_from": dict(sorted(self.primary_timed_from.items())),
            **{metric: self.latency(metric) for metric in METRICS},
            "tolerance": self.tolerance,
            "min_diff_ms": self.min_diff_ms,
            "max_error_rate": self.max_error_rate,
            "sampled": self.samples.sampled,
        }
        if self.has_baseline:
            out["baseline_errors"] = self.baseline_errors.total
            out["baseline_errors_by_status"] = dict(sorted(self.baseline_errors.by_status.items()))
            out["baseline_error_examples"] = list(self.baseline_errors.examples)
            out["baseline_prompt_token_mismatches"] = self.baseline_prompt_token_mismatches
        return out


def _paired(keys: tuple[str, str, str], top: np.ndarray, bottom: np.ndarray) -> dict[str, Any]:
    """The p50 ratio of ``top`` over ``bottom`` on the pairs where both have a
    value, its 95% interval and that ``n``, under the three ``keys``."""
    ratio = ratio_of_medians(top, bottom)
    interval = bootstrap_ratio(top, bottom)
    n = int((~(np.isnan(top) | np.isnan(bottom))).sum())
    ratio_key, ci_key, n_key = keys
    return {
        ratio_key: None if ratio is None else round(ratio, 4),
        ci_key: None if interval is None else [round(interval[0], 4), round(interval[1], 4)],
        n_key: n,
    }
