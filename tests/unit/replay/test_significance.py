"""McNemar's exact test on known tables, Mann-Whitney on known samples, the
paired bootstrap of a mean difference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shadow_proxy.replay.significance import bootstrap_mean_diff, mann_whitney, mcnemar_exact


def _pairs(both: int, only_first: int, only_second: int, neither: int) -> tuple[np.ndarray, ...]:
    rows = [(1, 1)] * both + [(1, 0)] * only_first + [(0, 1)] * only_second + [(0, 0)] * neither
    table = np.asarray(rows, dtype=bool)
    return table[:, 0], table[:, 1]


class TestMcNemar:
    """The two-sided exact p-value is twice the binomial(n, 1/2) tail of the smaller
    discordant count."""

    def test_known_table(self) -> None:
        # 1 vs 9 discordant: 2 * (C(10,0) + C(10,1)) / 2**10 = 22/1024.
        result = mcnemar_exact(*_pairs(30, 1, 9, 5))
        assert (result.only_first, result.only_second) == (1, 9)
        assert result.p_value == pytest.approx(22 / 1024)

    def test_balanced_is_one(self) -> None:
        assert mcnemar_exact(*_pairs(5, 4, 4, 5)).p_value == 1.0

    def test_no_discordant_pair(self) -> None:
        assert mcnemar_exact(*_pairs(10, 0, 0, 3)).p_value == 1.0

    def test_large_counts(self) -> None:
        # 0 vs 2000: 2 / 2**2000, far below any float: 0, no overflow.
        assert mcnemar_exact(*_pairs(0, 0, 2000, 0)).p_value == pytest.approx(0.0, abs=1e-300)
        p = mcnemar_exact(*_pairs(0, 480, 520, 0)).p_value
        assert 0.2 < p < 0.25  # normal approximation: z = 39.5 / sqrt(250) = 2.50 -> 0.22 ... 0.23


class TestMannWhitney:
    """Same samples: p near 1; shifted samples: small p; degenerate: None."""

    def test_shifted(self) -> None:
        rng = np.random.default_rng(0)
        x, y = rng.normal(0, 1, 200), rng.normal(1, 1, 200)
        p = mann_whitney(x, y)
        assert p is not None and p < 1e-6

    def test_known_value(self) -> None:
        # x all below y: U = 0, n1 = n2 = 5, mean 12.5, var 25 * 11 / 12:
        # z = (12.5 - 0.5) / sqrt(27.5), p = erfc(z / sqrt 2).
        p = mann_whitney(np.arange(5.0), np.arange(5.0) + 10)
        assert p == pytest.approx(math.erfc(12 / math.sqrt(25 * 11 / 12) / math.sqrt(2)))

    def test_same(self) -> None:
        x = np.asarray([3, 4, 4, 5, 6, 7, 8], dtype=float)
        p = mann_whitney(x, x.copy())
        assert p is not None and p > 0.9

    def test_degenerate(self) -> None:
        assert mann_whitney(np.array([]), np.array([1.0])) is None
        assert mann_whitney(np.full(5, 2.0), np.full(5, 2.0)) is None


class TestBootstrapMeanDiff:
    """The mean of per-record differences, its interval around it; NaN rows left out."""

    def test_interval_contains_the_shift(self) -> None:
        rng = np.random.default_rng(1)
        base = rng.normal(0, 1, 300)
        diff, ci = bootstrap_mean_diff(base + 0.5 + rng.normal(0, 0.1, 300), base)
        assert diff == pytest.approx(0.5, abs=0.03)
        assert ci is not None and ci[0] < diff < ci[1] and ci[0] > 0.45 and ci[1] < 0.55

    def test_identical_is_zero(self) -> None:
        x = np.linspace(0, 1, 50)
        assert bootstrap_mean_diff(x, x) == (0.0, (0.0, 0.0))

    def test_nan_and_too_few(self) -> None:
        a, b = np.array([1.0, np.nan, 3.0]), np.array([0.0, 1.0, np.nan])
        assert bootstrap_mean_diff(a, b) == (1.0, None)
        assert bootstrap_mean_diff(np.array([np.nan]), np.array([1.0])) == (None, None)
