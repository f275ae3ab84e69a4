"""The score tally on constructed scorings: per-group means, the floor, McNemar
on greedy records, lengths of sampled ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shadow_proxy.replay.logprobs import Scoring
from shadow_proxy.replay.scores import ScoreTally


def scoring(probs: list[float], top1: list[bool], texts: list[str] | None = None) -> Scoring:
    """Position i: the recorded token 0 at ``probs[i]``, token 1 holding the rest."""
    tops = tuple({0: math.log(p), 1: math.log(1 - p)} for p in probs)
    return Scoring(np.log(probs), np.asarray(top1), tops, tuple(texts or ["x"] * len(probs)))


class TestTally:
    def test_means_and_floor(self) -> None:
        tally = ScoreTally()
        base = scoring([0.5, 0.5], [True, True])
        cand = scoring([0.25, 0.5], [False, True])
        for _ in range(12):
            tally.add(cand, base, base, greedy=True, exact=(False, True))
        s = tally.summary()
        assert s["records"] == 12
        assert s["nll_mean"]["baseline"] == pytest.approx(math.log(2))
        assert s["nll_mean"]["candidate"] == pytest.approx((math.log(4) + math.log(2)) / 2)
        assert s["top1_agreement"]["candidate"] == 0.5 and s["top1_agreement"]["diff"] == -0.5
        kl0 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
        assert s["kl_mean"]["candidate"] == pytest.approx(kl0 / 2, rel=1e-5)
        assert s["kl_mean"]["baseline"] == 0.0  # the floor: the same scoring twice
        assert s["exact_match"] == {
            "candidate": 0,
            "baseline": 12,
            "only_candidate": 0,
            "only_baseline": 12,
        }
        assert s["mcnemar_p"] == pytest.approx(2 / 2**12, rel=1e-4)
        assert s["verdict"] == "worse"

    def test_tool_call_positions_apart(self) -> None:
        tally = ScoreTally()
        texts = ["Hi", "<tool_call>", '{"name": "f"}', "</tool_call>"]
        base = scoring([0.5] * 4, [True] * 4, texts)
        cand = scoring([0.5, 0.5, 0.25, 0.5], [True, True, False, True], texts)
        tally.add(cand, base, base, greedy=False, lengths=(4, 4))
        s = tally.summary()
        assert s["text_positions"] == 1 and s["tool_calls"]["positions"] == 3
        assert s["top1_agreement"]["diff"] == 0.0
        assert s["tool_calls"]["top1_agreement"]["candidate"] == pytest.approx(2 / 3, rel=1e-5)
        assert s["sampled_records"] == 1 and s["greedy_records"] == 0
        assert s["verdict"] == "no verdict" and "only 1 records" in s["reason"]

    def test_reservoir_and_positions(self) -> None:
        tally = ScoreTally(max_samples=5)
        base = scoring([0.5] * 3, [True, False, True])
        for _ in range(8):
            tally.add(base, base, base, greedy=True, exact=(True, True))
        assert tally.column("text.nll_mean.candidate").size == 5
        s = tally.summary()
        assert s["sampled"] is True and s["records"] == 8
        assert tally.at_position[0, :4].tolist() == [8, 8, 8, 0]
        assert tally.at_position[2, :3].tolist() == [8, 0, 8]

    def test_failures_counted(self) -> None:
        tally = ScoreTally()
        tally.failed("candidate")
        tally.failed("candidate")
        assert tally.summary()["failed"] == {"candidate": 2}
