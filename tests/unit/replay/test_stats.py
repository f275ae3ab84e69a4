"""Percentiles, the paired bootstrap, verdicts, the reservoir bound and the summary."""

from __future__ import annotations

import numpy as np

from shadow_proxy.replay.compare import compare
from shadow_proxy.replay.stats import COLUMNS, Samples, Tally, percentiles, positions
from tests.support.replay import observation as obs


class TestPercentiles:
    """Linear interpolation, NaNs ignored, with the number of values; positions are whole."""

    def test_values(self) -> None:
        assert percentiles(list(range(1, 102))) == {
            "p50": 51.0,
            "p90": 91.0,
            "p99": 100.0,
            "n": 101,
        }
        assert percentiles([float("nan"), 2.0]) == {"p50": 2.0, "p90": 2.0, "p99": 2.0, "n": 1}
        assert percentiles([]) is None

    def test_positions_are_integers(self) -> None:
        """A position is a token index: its p99 is one that occurred (not 0.39)."""
        values = [0.0] * 99 + [39.0]
        assert positions(values) == {"p50": 0, "p90": 0, "p99": 0, "n": 100}
        assert positions([0.0] * 98 + [39.0] * 2)["p99"] == 39
        assert all(isinstance(v, int) for v in positions([1.0, 2.0, 7.0]).values())


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
        tally.max_error_rate = 0.1
        s = tally.summary()
        assert s["records"] == 13 and s["replayed"] == 11
        assert s["skipped"] == {"late": 1, "no_response": 1}
        assert s["errors"] == 1 and s["errors_by_status"] == {"503": 1}
        assert s["error_examples"] == [{"status": "503", "message": "down"}]
        assert s["compared"] == 10 and s["exact_match_rate"] == round(7 / 10, 6)
        assert s["not_compared"] == {"failed": 1, "no_common_basis": 0}
        assert s["prompt_token_mismatches"] == 1
        assert s["differences"]["output"] == {"differs": 3, "noise": 1, "counted": 2}
        assert s["differences"]["outcome"] == {"differs": 1, "noise": 0, "counted": 1}
        assert s["first_divergence"] == {"p50": 1, "p90": 1, "p99": 1, "n": 3}
        ttft = s["ttft_ms"]
        # The failed candidate request has no latency: its pair is left out everywhere.
        primary = [100.0 + k for k in range(10)]
        candidate = [200.0 + 2 * k for k in range(10)]
        assert ttft["primary"] == {**percentiles([*primary, 1.0]), "n": 11}
        assert ttft["candidate"] == {**percentiles(candidate), "n": 10}
        assert ttft["ratio_p50"] == round(np.median(candidate) / np.median(primary), 4)
        assert ttft["n"] == 10 and ttft["baseline_n"] == 11
        assert ttft["baseline_ratio_p50"] == 1.0
        assert ttft["judged_against"] == "baseline" and ttft["verdict"] == "higher"
        assert ttft["judged"]["n"] == 10 and ttft["judged"]["reference"] == "baseline"
        assert ttft["candidate_vs_baseline_p50"] == ttft["judged"]["ratio_p50"]
        assert ttft["judged"]["reason"].startswith("higher: the 95% interval")


def failing(errors: int, total: int = 20, *, baseline: bool = False) -> Tally:
    """``total`` pairs, the candidate 3x slower, its first ``errors`` requests failed."""
    tally = Tally(has_baseline=baseline)
    for k in range(total):
        p = obs(100.0 + k)
        c = obs(300.0 + k, error="HTTP 500" if k < errors else None)
        b = obs(100.0 + k) if baseline else None
        tally.add(p, c, compare(p, c, 5), b, None if b is None else compare(p, b, 5))
    return tally


class TestFailedRequests:
    """Latency verdicts stand on successful pairs, and not at all past the error threshold."""

    def test_past_the_threshold_no_verdict(self) -> None:
        s = failing(errors=20).summary()
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            assert s[metric]["verdict"] == "no_verdict", s[metric]
            assert s[metric]["judged"]["reason"] == "no verdict: 20 of 20 candidate requests failed"
            assert s[metric]["candidate"] is None and s[metric]["ratio_p50"] is None
        assert s["errors_by_status"] == {"503": 20}
        assert s["not_compared"]["failed"] == 20 and s["compared"] == 0

    def test_below_the_threshold_judged_on_the_rest(self) -> None:
        s = failing(errors=1).summary()  # 1 of 20: 5%, not past it
        assert s["ttft_ms"]["verdict"] == "higher" and s["ttft_ms"]["n"] == 19
        assert failing(errors=2).summary()["ttft_ms"]["verdict"] == "no_verdict"

    def test_baseline_failures_withhold_it_too(self) -> None:
        tally = Tally(has_baseline=True)
        for k in range(20):
            p, c = obs(100.0 + k), obs(300.0 + k)
            b = obs(100.0 + k, error="refused")
            tally.add(p, c, compare(p, c, 5), b, compare(p, b, 5))
        s = tally.summary()
        assert s["baseline_errors"] == 20 and s["baseline_errors_by_status"] == {"503": 20}
        assert s["ttft_ms"]["judged"]["reason"] == ("no verdict: 20 of 20 baseline requests failed")

    def test_too_few_pairs(self) -> None:
        s = failing(errors=0, total=5).summary()
        assert s["ttft_ms"]["verdict"] == "no_verdict"
        assert "5 pairs with a value, at least 10 needed" in s["ttft_ms"]["judged"]["reason"]
