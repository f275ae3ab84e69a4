"""report.md's closed-loop section: counts, fallbacks, the per-turn table."""

from __future__ import annotations

from shadow_proxy.replay.turns_report import closed_loop_section

CLOSED = {
    "conversations": 2,
    "records": {"grouped_by_session": 0, "grouped_by_prefix": 5, "standalone": 1},
    "fell_back_open_loop": {"no_spans": 1},
    "evicted": 0,
    "turns_completed": 6,
    "duration_ratio_p50": 1.25,
    "duration_ratio_n": 1,
    "think_error_ms": {"n": 3, "p50": 2.0, "max": 9.5},
    "per_turn": [
        {
            "turn": 0,
            "records": 2,
            "ttft_ratio_p50": 0.5,
            "e2e_ratio_p50": 2.0,
            "candidate_tokens_mean": 13.0,
            "primary_tokens_mean": 8.0,
            "cached_share_mean": None,
        },
    ],
}


def test_section():
    text = "\n".join(closed_loop_section(CLOSED, {"excluded": 4}))
    assert "## Closed loop" in text
    assert "by prefix 5, standalone 1" in text
    assert "no_spans 1" in text
    assert "| 0 | 2 | 0.5 | 2 | 13 | 8 | - |" in text
    assert "first 4 records sent were excluded" in text


def test_nothing_fell_back():
    text = "\n".join(closed_loop_section({**CLOSED, "fell_back_open_loop": {}}, None))
    assert "open-loop (conversations): none" in text
