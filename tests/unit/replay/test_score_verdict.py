"""The score verdict from constructed summaries: each rule alone decides."""

from __future__ import annotations

from typing import Any

from shadow_proxy.replay.score_verdict import verdict


def entry(c: float, b: float, ci: tuple[float, float], n: int = 50) -> dict[str, Any]:
    return {"candidate": c, "baseline": b, "diff": c - b, "ci": list(ci), "n": n}


def score(**changes: Any) -> dict[str, Any]:
    same = {
        "top1_agreement": entry(0.8, 0.8, (-0.004, 0.004)),
        "nll_mean": entry(2.0, 2.0, (-0.005, 0.005)),
        "kl_mean": entry(0.01, 0.01, (-0.001, 0.001)),
    }
    out: dict[str, Any] = {
        "records": 50,
        **same,
        "tool_calls": {k: {"diff": None, "ci": None, "n": 0} for k in same},
        "exact_match": {"candidate": 40, "baseline": 40, "only_candidate": 2, "only_baseline": 2},
        "greedy_records": 45,
        "mcnemar_p": 1.0,
        "sampled_records": 5,
        "lengths_p": 0.6,
    }
    out.update(changes)
    return out


class TestVerdict:
    def test_no_difference(self) -> None:
        v, reason = verdict(score())
        assert v == "no difference" and "top-1 agreement candidate 0.8" in reason

    def test_too_few_records(self) -> None:
        assert verdict(score(records=9)) == (
            "no verdict",
            "only 9 records scored; a verdict needs 10",
        )

    def test_top1_lower(self) -> None:
        v, reason = verdict(score(top1_agreement=entry(0.7, 0.8, (-0.12, -0.08))))
        assert v == "worse" and "top-1" in reason

    def test_top1_lower_within_half_a_point(self) -> None:
        assert verdict(score(top1_agreement=entry(0.796, 0.8, (-0.0045, -0.0035))))[0] == (
            "no difference"
        )

    def test_kl_above_floor(self) -> None:
        v, reason = verdict(score(kl_mean=entry(0.05, 0.01, (0.03, 0.05))))
        assert v == "worse" and "over the floor" in reason

    def test_mcnemar(self) -> None:
        exact = {"candidate": 30, "baseline": 40, "only_candidate": 0, "only_baseline": 10}
        v, reason = verdict(score(exact_match=exact, mcnemar_p=0.002))
        assert v == "worse" and "McNemar p=0.002" in reason
        exact = {"candidate": 40, "baseline": 30, "only_candidate": 10, "only_baseline": 0}
        assert verdict(score(exact_match=exact, mcnemar_p=0.002))[0] == "no difference"

    def test_lengths(self) -> None:
        v, reason = verdict(score(lengths_p=0.001))
        assert v == "worse" and "Mann-Whitney" in reason

    def test_tool_calls_apart(self) -> None:
        tools = {
            "top1_agreement": entry(0.5, 0.9, (-0.5, -0.3), n=20),
            "nll_mean": {"diff": None, "ci": None, "n": 0},
            "kl_mean": {"diff": None, "ci": None, "n": 0},
        }
        v, reason = verdict(score(tool_calls=tools))
        assert v == "worse" and reason.startswith("tool calls top-1")

    def test_better(self) -> None:
        v, _ = verdict(
            score(
                top1_agreement=entry(0.9, 0.8, (0.08, 0.12)), nll_mean=entry(1.5, 2.0, (-0.6, -0.4))
            )
        )
        assert v == "better"
