"""Percentiles, the paired bootstrap, verdicts, the reservoir bound and the summary."""

from __future__ import annotations

import numpy as np
import pytest

from shadow_proxy.replay.compare import compare
from shadow_proxy.replay.stats import (
    COLUMNS,
    Samples,
    Tally,
    bootstrap_ratio,
    percentiles,
    verdict,
)
from tests.support.replay import observation as obs


class TestPercentiles:
    """Linear interpolation, NaNs ignored."""

    def test_values(self) -> None:
        assert percentiles(list(range(1, 102))) == {"p50": 51.0, "p90": 91.0, "p99": 100.0}
        assert percentiles([float("nan"), 2.0]) == {"p50": 2.0, "p90": 2.0, "p99": 2.0}
        assert percentiles([]) is None


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
        assert verdict((lo, hi), 0.05) == "higher"

    def test_same_distribution_has_no_difference(self) -> None:
        rng = np.random.default_rng(2)
        a, b = rng.lognormal(3, 0.3, 400), rng.lognormal(3, 0.3, 400)
        interval = bootstrap_ratio(a, b)
        assert interval is not None and interval[0] < 1 < interval[1]
        assert verdict(interval, 0.05) == "no_difference"

    def test_deterministic_and_nan_pairs_dropped(self) -> None:
        a = np.array([1.0, 2.0, np.nan, 4.0, 5.0])
        b = np.array([1.0, np.nan, 3.0, 4.0, 5.0])
        assert bootstrap_ratio(a, b) == bootstrap_ratio(a, b)
        assert bootstrap_ratio(a[:1], b[:1]) is None

    def test_verdicts(self) -> None:
        assert verdict((1.06, 1.2), 0.05) == "higher"
        assert verdict((1.04, 1.2), 0.05) == "no_difference"
        assert verdict((0.5, 0.95), 0.05) == "lower"
        assert verdict(None, 0.05) == "unknown"
        assert verdict((2.0, 9.0), 0.05, difference_ms=0.4, min_diff_ms=1.0) == "no_difference"
        assert verdict((2.0, 9.0), 0.05, difference_ms=-1.5, min_diff_ms=1.0) == "higher"


class TestSamples:
    """At most max_samples rows, a uniform reservoir past it."""

    def test_bound(self) -> None:
        samples = Samples(max_samples=100)
        for k in range(10_000):
            samples.add({"ttft_ms.primary": k})
        column = samples.column("ttft_ms.primary")
        assert column.size == 100 and samples.sampled
        assert all(samples.columns[c].buffer_info()[1] == 100 for c in COLUMNS)
        assert 2_000 < float(np.median(column)) < 8_000  # drawn from the whole range


class TestTally:
    """The summary's numbers from known pairs."""

    def test_summary(self) -> None:
        tally = Tally(has_baseline=True)
        tally.skip("no_response")
        tally.skip("late")
        for k in range(10):
            p = obs(100.0 + k)
            c = obs(200.0 + 2 * k, ids=(1, 3) if k < 3 else (1, 2))
            b = obs(100.0 + k, ids=(1, 3) if k == 0 else (1, 2))
            tally.add(p, c, compare(p, c, 5 if k else 4), b, compare(p, b, 5))
        c_err = obs(1.0, error="down")
        p = obs(1.0)
        tally.add(p, c_err, compare(p, c_err, 5), obs(1.0), compare(p, obs(1.0), 5))
        s = tally.summary()
        assert s["records"] == 13 and s["replayed"] == 11
        assert s["skipped"] == {"late": 1, "no_response": 1}
        assert s["errors"] == 1 and s["errors_by_status"] == {"503": 1}
        assert s["compared"] == 11 and s["exact_match_rate"] == round(8 / 11, 6)
        assert s["prompt_token_mismatches"] == 1
        assert s["differences"]["output"] == {"differs": 3, "noise": 1, "counted": 2}
        assert s["differences"]["outcome"] == {"differs": 1, "noise": 0, "counted": 1}
        assert s["first_divergence"] == {"p50": 1.0, "p90": 1.0, "p99": 1.0}
        ttft = s["ttft_ms"]
        primary = [1.0] + [100.0 + k for k in range(10)]
        candidate = [1.0] + [200.0 + 2 * k for k in range(10)]
        assert ttft["primary"]["p50"] == float(np.percentile(primary, 50))
        assert ttft["candidate"]["p50"] == float(np.percentile(candidate, 50))
        assert ttft["ratio_p50"] == round(ttft["candidate"]["p50"] / ttft["primary"]["p50"], 4)
        assert ttft["baseline_ratio_p50"] == 1.0
        assert ttft["judged_against"] == "baseline" and ttft["verdict"] == "higher"
