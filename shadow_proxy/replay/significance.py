"""Paired and two-sample tests for the score verdict (``--score``).

Pure (numpy and math, no socket, no clock). Each function runs once per
summary, on columns of per-record values:

- ``mcnemar_exact``: the exact (binomial) McNemar test on the discordant pairs
  of a paired yes/no outcome (greedy exact match, candidate vs baseline, on the
  same records): under no difference, each discordant pair is as likely to
  favour either side, so the two-sided p-value is the binomial tail of the
  smaller count doubled (capped at 1; 1 without a discordant pair);
- ``mann_whitney``: the two-sided Mann-Whitney U test with the normal
  approximation, midranks for ties and the tie correction of the variance
  (output lengths of sampled records: the two sides' samples are not paired);
- ``bootstrap_mean_diff``: the mean of per-record differences and its 95%
  interval from a paired bootstrap (``BOOTSTRAP_ROUNDS`` rounds, fixed seed,
  resampling records with replacement), as ``verdicts.bootstrap_ratio`` does for
  latency ratios.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from shadow_proxy.replay.verdicts import BOOTSTRAP_ROUNDS, CONFIDENCE


@attrs.frozen
class McNemar:
    """A paired yes/no comparison: the discordant counts and the p-value."""

    #: Records where only the first side / only the second side said yes.
    only_first: int
    only_second: int
    p_value: float


def mcnemar_exact(first: np.ndarray, second: np.ndarray) -> McNemar:
    """Exact McNemar test of two boolean columns over the same records."""
    a, b = np.asarray(first, dtype=bool), np.asarray(second, dtype=bool)
    only_first, only_second = int(np.sum(a & ~b)), int(np.sum(~a & b))
    n = only_first + only_second
    if n == 0:
        return McNemar(only_first, only_second, 1.0)
    k = min(only_first, only_second)
    # P(X <= k), X ~ Binomial(n, 1/2), in logs (n may be thousands).
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
    top = max(logs)
    tail = math.exp(top + math.log(sum(math.exp(v - top) for v in logs)) - n * math.log(2))
    return McNemar(only_first, only_second, min(1.0, 2 * tail))


def _midranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(values.size, dtype=float)
    ordered = values[order]
    i = 0
    while i < values.size:
        j = i
        while j + 1 < values.size and ordered[j + 1] == ordered[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def mann_whitney(x: np.ndarray, y: np.ndarray) -> float | None:
    """Two-sided p-value that ``x`` and ``y`` come from the same distribution;
    None when a side is empty or every value is the same."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n1, n2 = x.size, y.size
    if n1 == 0 or n2 == 0:
        return None
    both = np.concatenate([x, y])
    ranks = _midranks(both)
    u = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    n = n1 + n2
    _, counts = np.unique(both, return_counts=True)
    ties = float(np.sum(counts.astype(float) ** 3 - counts))
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return None
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)  # continuity correction
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def bootstrap_mean_diff(
    first: np.ndarray, second: np.ndarray, *, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0
) -> tuple[float | None, tuple[float, float] | None]:
    """mean(first - second) over the records where both have a value, and its
    95% paired-bootstrap interval (None below 2 such records)."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    keep = ~(np.isnan(a) | np.isnan(b))
    diff = a[keep] - b[keep]
    if diff.size == 0:
        return None, None
    mean = float(diff.mean())
    if diff.size < 2:
        return mean, None
    rng = np.random.default_rng(seed)
    block = max(1, min(rounds, 2_000_000 // diff.size))
    means: list[np.ndarray] = []
    done = 0
    while done < rounds:
        size = min(block, rounds - done)
        means.append(diff[rng.integers(0, diff.size, size=(size, diff.size))].mean(axis=1))
        done += size
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(np.concatenate(means), (tail, 100 - tail))
    return mean, (float(lo), float(hi))
