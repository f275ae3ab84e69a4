"""The verdict logic: the paired bootstrap, the tolerance band, the minimum
difference, too few pairs and too many failures, each with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from shadow_proxy.replay.verdicts import (
    bootstrap_ratio,
    failure,
    judge,
    ratio_of_medians,
)


class TestBootstrap:
    """Intervals cover the true ratio; verdicts need the whole interval outside the band."""

    def test_interval_of_a_clear_shift(self) -> None:
        rng = np.random.default_rng(1)
        base = rng.lognormal(3, 0.3, 400)
        lo, hi = bootstrap_ratio(base * 1.5, base)
        assert lo == pytest.approx(1.5) and hi == pytest.approx(1.5)
        noisy = base * rng.lognormal(0.4, 0.1, 400)  # ~1.49x with noise
        lo, hi = bootstrap_ratio(noisy, base)
        assert 1.3 < lo < 1.49 < hi < 1.7
        assert judge(noisy, base, reference_name="primary").verdict == "higher"

    def test_same_distribution_has_no_difference(self) -> None:
        rng = np.random.default_rng(2)
        a, b = rng.lognormal(3, 0.3, 400), rng.lognormal(3, 0.3, 400)
        interval = bootstrap_ratio(a, b)
        assert interval is not None and interval[0] < 1 < interval[1]
        judged = judge(a, b, reference_name="primary")
        assert judged.verdict == "no_difference" and "overlaps" in judged.reason

    def test_deterministic_and_nan_pairs_dropped(self) -> None:
        a = np.array([1.0, 2.0, np.nan, 4.0, 5.0])
        b = np.array([1.0, np.nan, 3.0, 4.0, 5.0])
        assert bootstrap_ratio(a, b) == bootstrap_ratio(a, b)
        assert bootstrap_ratio(a[:1], b[:1]) is None


class TestJudge:
    """Each verdict and the ratio it judged, on the same pairs as its interval."""

    def test_ratio_and_interval_on_the_same_pairs(self) -> None:
        """An unpaired p50 over a p50 judged 200 candidate values against the 20
        primary ones that had a value; the ratio must be of the pairs."""
        candidate = np.full(200, 10.0)
        candidate[:20] = 30.0
        primary = np.full(200, np.nan)
        primary[:20] = 30.0  # only the slow ones have a primary value
        judged = judge(candidate, primary, reference_name="primary")
        assert judged.n == 20 and judged.ratio_p50 == 1.0
        assert judged.ci95 == (1.0, 1.0) and judged.verdict == "no_difference"
        assert ratio_of_medians(candidate, primary) == 1.0

    def test_verdicts_and_reasons(self) -> None:
        base = np.linspace(10, 20, 50)
        assert judge(base * 1.2, base, reference_name="baseline").reason == (
            "higher: the 95% interval [1.2, 1.2] lies above 1.05"
        )
        assert judge(base * 0.5, base, reference_name="primary").verdict == "lower"
        assert judge(base * 1.04, base, reference_name="primary").verdict == "no_difference"

    def test_min_diff_says_why(self) -> None:
        """Outside the band but within --min-diff-ms: no difference, and the reason says so."""
        base = np.linspace(0.1, 0.2, 50)
        judged = judge(base * 3, base, reference_name="primary", min_diff_ms=1.0)
        assert judged.verdict == "no_difference"
        assert judged.reason == (
            "no difference: the 95% interval [3, 3] lies outside [0.952, 1.05], but the p50s "
            "differ by 0.3 ms, under --min-diff-ms 1"
        )

    def test_no_verdict(self) -> None:
        base = np.linspace(10, 20, 50)
        few = judge(base[:9] * 2, base[:9], reference_name="primary")
        assert (few.verdict, few.n) == ("no_verdict", 9)
        failed = failure(262, 262, "candidate", 0.05)
        assert failed == "262 of 262 candidate requests failed"
        judged = judge(base * 2, base, reference_name="primary", failed=failed)
        assert judged.verdict == "no_verdict" and judged.reason == f"no verdict: {failed}"
        assert failure(1, 20, "candidate", 0.05) is None
        assert failure(2, 20, "candidate", 0.05) is not None
