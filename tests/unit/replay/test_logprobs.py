"""Reading vLLM's prompt_logprobs, the KL lower bound on known distributions,
tool-call positions."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import pytest

from shadow_proxy.replay.logprobs import (
    Scoring,
    ScoringError,
    kl,
    kl_lower_bound,
    score_body,
    tool_call_mask,
)


def _entry(probs: dict[int, float], rank_of: dict[int, int], text: str = "x") -> dict:
    return {
        str(t): {"logprob": math.log(p), "rank": rank_of[t], "decoded_token": text}
        for t, p in probs.items()
    }


def answer(entries: list[dict | None]) -> dict:
    return {"choices": [{"index": 0, "text": "", "prompt_logprobs": entries}]}


class TestBody:
    def test_prompt_and_output(self) -> None:
        body = score_body("m", [1, 2], [3, 4], 10)
        assert body["prompt"] == [1, 2, 3, 4] and body["max_tokens"] == 1
        assert body["prompt_logprobs"] == 10 and body["stream"] is False


class TestScoring:
    """The output's positions are the last entries; rank 1 is top-1."""

    def test_reads_the_output_positions(self) -> None:
        body = answer(
            [
                None,
                _entry({7: 0.5, 8: 0.5}, {7: 1, 8: 2}),  # a prompt position: not scored
                _entry({3: 0.6, 9: 0.4}, {3: 1, 9: 2}, "a"),
                _entry({4: 0.1, 9: 0.9}, {4: 2, 9: 1}, "b"),
            ]
        )
        s = Scoring.from_response(body, [3, 4])
        assert np.allclose(s.logprobs, np.log([0.6, 0.1]))
        assert s.top1.tolist() == [True, False]
        assert s.texts == ("a", "b") and len(s) == 2

    def test_no_prompt_logprobs(self) -> None:
        """What Dynamo 1.6.1 answers: a completion without the field."""
        with pytest.raises(ScoringError, match="no choices"):
            Scoring.from_response({"choices": [{"text": "x", "index": 0}]}, [1])

    def test_recorded_token_missing(self) -> None:
        with pytest.raises(ScoringError, match="recorded token 5"):
            Scoring.from_response(answer([None, _entry({3: 1.0}, {3: 1})]), [5])

    def test_malformed_entry(self) -> None:
        """A malformed answer is a ``ScoringError`` (counted), never a crash of the run."""
        with pytest.raises(ScoringError, match="malformed"):
            Scoring.from_response(answer([None, {"5": {"rank": 1}}]), [5])
        with pytest.raises(ScoringError, match="malformed"):
            Scoring.from_response(answer([None, {"5": {"logprob": "x", "rank": 1}}]), [5])

    def test_too_short(self) -> None:
        with pytest.raises(ScoringError, match="entries"):
            Scoring.from_response(answer([None]), [5])


class TestKl:
    """Exact on full distributions; never above the true KL on truncated lists."""

    P: ClassVar[dict[int, float]] = {0: 0.5, 1: 0.3, 2: 0.2}
    Q: ClassVar[dict[int, float]] = {0: 0.2, 1: 0.3, 2: 0.5}

    def _log(self, d: dict[int, float]) -> dict[int, float]:
        return {k: math.log(v) for k, v in d.items()}

    def true_kl(self) -> float:
        return sum(p * math.log(p / self.Q[k]) for k, p in self.P.items())

    def test_full_lists_are_exact(self) -> None:
        assert kl_lower_bound(self._log(self.P), self._log(self.Q)) == pytest.approx(self.true_kl())

    def test_identical_is_zero(self) -> None:
        assert kl_lower_bound(self._log(self.P), self._log(self.P)) == 0.0

    def test_truncated_is_a_lower_bound(self) -> None:
        # Only token 0 shared: {0: 0.5 | 0.2}, rest {0.5 | 0.8}.
        p, q = {0: math.log(0.5), 1: math.log(0.3)}, {0: math.log(0.2), 2: math.log(0.5)}
        expected = 0.5 * math.log(0.5 / 0.2) + 0.5 * math.log(0.5 / 0.8)
        got = kl_lower_bound(p, q)
        assert got == pytest.approx(expected)
        assert 0 < got < self.true_kl()

    def test_per_position(self) -> None:
        a = Scoring(np.zeros(2), np.ones(2, bool), (self._log(self.P),) * 2, ("", ""))
        b = Scoring(np.zeros(2), np.ones(2, bool), (self._log(self.Q), self._log(self.P)), ("", ""))
        assert kl(a, b) == pytest.approx([self.true_kl(), 0.0])
        with pytest.raises(ScoringError):
            kl(a, Scoring(np.zeros(1), np.ones(1, bool), (self._log(self.P),), ("",)))


class TestToolCalls:
    """Positions overlapping <tool_call>...</tool_call>, markers included."""

    def test_segment(self) -> None:
        texts = ["Sure", ". ", "<tool", "_call>", '{"name"', ': "f"}', "</tool_call>", " done"]
        assert tool_call_mask(texts).tolist() == [False, False, True, True, True, True, True, False]

    def test_unclosed_segment_runs_to_the_end(self) -> None:
        assert tool_call_mask(["a", "<tool_call>", "{", '"x']).tolist() == [False, True, True, True]

    def test_none(self) -> None:
        assert not tool_call_mask(["plain", " text"]).any()
