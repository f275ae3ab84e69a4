"""Per-turn closed-loop figures: paired ratios, answer lengths, cached shares."""

from __future__ import annotations

from shadow_proxy.replay import turn_tally
from shadow_proxy.replay.compare import Observation
from shadow_proxy.replay.turn_tally import TurnTally


def answer(ttft: float, tokens: int, cached: int | None = None) -> Observation:
    return Observation(
        outcome="complete",
        output_tokens=tokens,
        ttft_ms=ttft,
        e2e_ms=ttft * 2,
        prompt_tokens=100,
        cached_tokens=cached,
    )


def test_per_turn():
    tally = TurnTally()
    tally.observe(1, answer(10, 8), answer(20, 13, cached=50))
    tally.observe(1, answer(10, 8), answer(30, 13, cached=70))
    tally.observe(0, answer(10, 8), answer(5, 3))
    rows = tally.per_turn()
    assert [r["turn"] for r in rows] == [0, 1]
    assert rows[1] == {
        "turn": 1,
        "records": 2,
        "ttft_ratio_p50": 2.5,
        "e2e_ratio_p50": 2.5,
        "candidate_tokens_mean": 13.0,
        "primary_tokens_mean": 8.0,
        "cached_share_mean": 0.6,
    }
    assert rows[0]["cached_share_mean"] is None
    assert tally.completed == 3


def test_samples_are_bounded(monkeypatch):
    monkeypatch.setattr(turn_tally, "MAX_TURN_SAMPLES", 2)
    tally = TurnTally()
    for ms in (1.0, -3.0, 9.0):
        tally.think_error(ms)
    assert tally.think_summary() == {"n": 2, "p50": 2.0, "max": 3.0}
