"""Latency verdicts: the one place that decides whether a candidate is slower.

Pure (numpy, no socket, no clock). ``judge`` runs once per metric when a
summary is made (``stats.Tally.latency``; later the live replay's windows call
it the same way). It takes two columns of per-request values, the candidate's
and its reference's (the primary's, or with a baseline the baseline's), NaN
where a request has no value or failed on either side, and returns a
``Judgement``: the ratio of the p50s on the pairs where both sides have a
value, its 95% interval from a paired bootstrap over those same pairs, how many
pairs that was, the verdict and, in words, why.

The verdict (``VERDICTS``):

- ``no_verdict`` when the data cannot support one: too many requests failed
  (``failure`` names them: past ``--max-error-rate``), or fewer than
  ``MIN_PAIRS`` pairs have the value;
- ``higher`` / ``lower`` when the whole interval lies above ``1 + tolerance``
  / below ``1 / (1 + tolerance)`` and the p50s differ by at least
  ``min_diff_ms`` (Diffy's absolute threshold beside its relative one: a ratio
  of near-zero latencies is noise however large);
- ``no_difference`` otherwise; when the interval lies outside the band but the
  p50s differ by less than ``min_diff_ms``, the reason says so.

The bootstrap: ``BOOTSTRAP_ROUNDS`` rounds, fixed seed, each resampling the
pairs with replacement (the same requests for both sides) and taking the ratio
of the medians; the interval is the 2.5th and 97.5th percentiles of those.
"""

from __future__ import annotations

import attrs
import numpy as np

BOOTSTRAP_ROUNDS = 1000
CONFIDENCE = 0.95
#: Fewer pairs than this with a metric give no verdict on it.
MIN_PAIRS = 10
#: A latency ratio counts only when its whole 95% interval lies outside
#: [1/(1+T), 1+T] and the p50s differ by at least ``DEFAULT_MIN_DIFF_MS``.
#: Against a baseline both sides are measured alike (by the replayer, on the
#: same path): 5%.
DEFAULT_TOLERANCE = 0.05
#: Against the primary alone the two were measured on different paths: the
#: primary's request went through the frontend's template and tokenizer, the
#: replay sends token ids (measured in front of Dynamo 1.6.1: the primary's
#: TTFT grows with the prompt, 11 to 16 ms over 30 to 830 tokens, the
#: replay's does not), so only a change beyond [0.67, 1.5] is judged.
DEFAULT_TOLERANCE_WITHOUT_BASELINE = 0.5


def default_tolerance(has_baseline: bool) -> float:
    """The tolerance when ``--tolerance`` is not given."""
    return DEFAULT_TOLERANCE if has_baseline else DEFAULT_TOLERANCE_WITHOUT_BASELINE


DEFAULT_MIN_DIFF_MS = 1.0
#: Past this fraction of failed requests (candidate's, or baseline's) no
#: latency verdict is given.
DEFAULT_MAX_ERROR_RATE = 0.05

HIGHER = "higher"
LOWER = "lower"
NO_DIFFERENCE = "no_difference"
NO_VERDICT = "no_verdict"
VERDICTS = (HIGHER, LOWER, NO_DIFFERENCE, NO_VERDICT)


@attrs.frozen
class Judgement:
    """One metric's verdict and what it was computed on."""

    #: What the candidate was divided by: ``primary`` or ``baseline``.
    reference: str
    #: Pairs where both sides have the value (successful requests only).
    n: int
    #: p50(candidate) / p50(reference) on those pairs.
    ratio_p50: float | None
    ci95: tuple[float, float] | None
    verdict: str
    #: Why, in one sentence a person can check.
    reason: str

    def to_json(self) -> dict[str, object]:
        return {
            "reference": self.reference,
            "n": self.n,
            "ratio_p50": _round(self.ratio_p50),
            "ci95": None if self.ci95 is None else [_round(v) for v in self.ci95],
            "verdict": self.verdict,
            "reason": self.reason,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def paired(numerator: np.ndarray, denominator: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows where both columns have a value."""
    keep = ~(np.isnan(numerator) | np.isnan(denominator))
    return numerator[keep], denominator[keep]


def ratio_of_medians(numerator: np.ndarray, denominator: np.ndarray) -> float | None:
    """p50(numerator) / p50(denominator) on the paired rows; None without any
    or when the denominator's median is not positive."""
    num, den = paired(numerator, denominator)
    if num.size == 0:
        return None
    bottom = float(np.median(den))
    return float(np.median(num)) / bottom if bottom > 0 else None


def bootstrap_ratio(
    numerator: np.ndarray, denominator: np.ndarray, *, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0
) -> tuple[float, float] | None:
    """95% interval of p50(numerator)/p50(denominator), resampling pairs; None
    with fewer than 2 complete pairs."""
    num, den = paired(numerator, denominator)
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


def failure(failed: int, total: int, target: str, max_error_rate: float) -> str | None:
    """Why no verdict can stand when ``failed`` of ``total`` requests to
    ``target`` failed (more than ``max_error_rate`` of them); None otherwise."""
    if total and failed > max_error_rate * total:
        return f"{failed} of {total} {target} requests failed"
    return None


def judge(
    candidate: np.ndarray,
    reference: np.ndarray,
    *,
    reference_name: str,
    tolerance: float = DEFAULT_TOLERANCE,
    min_diff_ms: float = DEFAULT_MIN_DIFF_MS,
    failed: str | None = None,
    min_pairs: int = MIN_PAIRS,
) -> Judgement:
    """The verdict on ``candidate`` against ``reference`` (see the module doc);
    ``failed`` (from ``failure``) withholds it."""
    num, den = paired(np.asarray(candidate, dtype=float), np.asarray(reference, dtype=float))
    n = int(num.size)
    ratio = ratio_of_medians(num, den)
    interval = bootstrap_ratio(num, den)

    def made(verdict: str, reason: str) -> Judgement:
        return Judgement(reference_name, n, ratio, interval, verdict, reason)

    if failed is not None:
        return made(NO_VERDICT, f"no verdict: {failed}")
    if n < min_pairs or interval is None or ratio is None:
        return made(NO_VERDICT, f"no verdict: {n} pairs with a value, at least {min_pairs} needed")
    band = (1 / (1 + tolerance), 1 + tolerance)
    lo, hi = interval
    shown = f"the 95% interval [{lo:.3g}, {hi:.3g}]"
    outside = lo > band[1] or hi < band[0]
    difference = float(np.median(num) - np.median(den))
    if outside and abs(difference) < min_diff_ms:
        return made(
            NO_DIFFERENCE,
            f"no difference: {shown} lies outside [{band[0]:.3g}, {band[1]:.3g}], but the "
            f"p50s differ by {abs(difference):.3g} ms, under --min-diff-ms {min_diff_ms:g}",
        )
    if lo > band[1]:
        return made(HIGHER, f"higher: {shown} lies above {band[1]:.3g}")
    if hi < band[0]:
        return made(LOWER, f"lower: {shown} lies below {band[0]:.3g}")
    return made(NO_DIFFERENCE, f"no difference: {shown} overlaps [{band[0]:.3g}, {band[1]:.3g}]")
