"""The rolling window: the last window_s of pairs, bounded, judged as the batch report is."""

from __future__ import annotations

import math

import pytest

from shadow_proxy.replay.compare import compare
from shadow_proxy.replay.stats import Tally
from shadow_proxy.replay.window import JUDGED_PAIRS, Pair, Window, empty_snapshot, greedy
from tests.support.replay import observation as obs

S = 1_000_000_000


def window(**kwargs) -> Window:
    settings = {"tolerance": 0.05, "min_diff_ms": 1.0, "max_error_rate": 0.05, "window_s": 10.0}
    return Window(has_baseline=True, **{**settings, **kwargs})


def pair(at_s: float, candidate_ms: float, baseline_ms: float, k: int = 0, **kw) -> Pair:
    p = obs(100.0 + k)
    c = obs(candidate_ms + k, **kw)
    b = obs(baseline_ms + k)
    return Pair(int(at_s * S), p, c, compare(p, c, 5), b, compare(p, b, 5), greedy=True)


class TestExpiry:
    """Pairs older than window_s go; at most max_pairs are kept."""

    def test_old_pairs_go(self) -> None:
        w = window()
        for k in range(20):
            w.add(pair(k, 100.0, 100.0))
        kept = w.pairs(int(19.5 * S))
        assert [p.at_ns // S for p in kept] == list(range(10, 20))

    def test_bound(self) -> None:
        w = window(max_pairs=5)
        for k in range(50):
            w.add(pair(0, 100.0, 100.0, k))
        assert len(w) == 5

    def test_outputs_dropped(self) -> None:
        w = window()
        w.add(pair(0, 100.0, 100.0))
        kept = w.pairs(0)[0]
        assert kept.candidate.token_ids is None and kept.primary.token_ids is None
        assert kept.candidate.ttft_ms == 100.0


class TestVerdicts:
    """The window's verdicts are the batch Tally's on the same pairs."""

    def test_slower_reads_one(self) -> None:
        w = window()
        pairs = [pair(0, 500.0, 100.0, k) for k in range(30)]
        snapshot = w.judge(pairs)
        tally = Tally(has_baseline=True, tolerance=0.05)
        for p in pairs:
            tally.add(p.primary, p.candidate, p.diff, p.baseline, p.baseline_diff)
        batch = tally.latency("ttft_ms")["judged"]
        assert snapshot.verdicts["ttft"] == 1.0
        expected = (batch["ratio_p50"], *batch["ci95"])
        assert snapshot.ratios["ttft"] == pytest.approx(expected, abs=1e-4)
        assert snapshot.pairs == 30

    def test_same_reads_zero_and_faster_minus_one(self) -> None:
        w = window()
        assert w.judge([pair(0, 100.0, 100.0, k) for k in range(30)]).verdicts["ttft"] == 0.0
        assert w.judge([pair(0, 20.0, 100.0, k) for k in range(30)]).verdicts["e2e"] == -1.0

    def test_judged_on_a_sample_past_the_bound(self) -> None:
        """Past JUDGED_PAIRS a uniform sample is judged; the pair count is the window's."""
        pairs = [pair(0, 500.0, 100.0, k % 50) for k in range(JUDGED_PAIRS + 500)]
        snapshot = window().judge(pairs)
        assert snapshot.pairs == JUDGED_PAIRS + 500 and snapshot.verdicts["ttft"] == 1.0

    def test_too_few_pairs_is_nan(self) -> None:
        snapshot = window().judge([pair(0, 500.0, 100.0, k) for k in range(3)])
        assert all(math.isnan(v) for v in snapshot.verdicts.values())

    def test_failures_withhold_the_verdict(self) -> None:
        pairs = [pair(0, 500.0, 100.0, k) for k in range(30)]
        pairs += [pair(0, 500.0, 100.0, k, error="down") for k in range(5)]
        assert math.isnan(window().judge(pairs).verdicts["ttft"])


class TestOutputs:
    """Exact match on greedy records per target; the output verdict counts
    differences the baseline does not show."""

    def test_exact_match_and_output_verdict(self) -> None:
        pairs = [pair(0, 100.0, 100.0, k, ids=(9, 9) if k < 10 else (1, 2)) for k in range(20)]
        snapshot = window().judge(pairs)
        assert snapshot.exact_match == {"candidate": 0.5, "baseline": 1.0}
        assert snapshot.verdicts["output"] == 1.0
        same = window().judge([pair(0, 100.0, 100.0, k) for k in range(20)])
        assert same.verdicts["output"] == 0.0

    def test_greedy(self) -> None:
        assert greedy({"temperature": 0}) and greedy({"temperature": 0.0})
        assert not greedy({}) and not greedy({"temperature": 0.7})

    def test_empty(self) -> None:
        snapshot = empty_snapshot(False)
        assert snapshot.pairs == 0 and list(snapshot.exact_match) == ["candidate"]
        assert math.isnan(snapshot.verdicts["output"])
