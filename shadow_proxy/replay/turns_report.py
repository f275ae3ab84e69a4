"""report.md's "Closed loop" section, from summary.json's ``closed_loop``. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def closed_loop_section(closed: Mapping[str, Any], warmup: Mapping[str, Any] | None) -> list[str]:
    """The grouping counts, what fell back to open-loop and why, the per-turn
    table and the conversation metrics."""
    records = closed.get("records") or {}
    fell = closed.get("fell_back_open_loop") or {}
    think = closed.get("think_error_ms") or {}
    lines = [
        "",
        "## Closed loop",
        "",
        "Each conversation's turn k+1 carried the candidate's own answer to turn k and "
        "left the recorded think time after it; first turns kept the recorded schedule.",
        "",
        f"- conversations: {closed.get('conversations', 0)}; records grouped by session "
        f"{records.get('grouped_by_session', 0)}, by prefix {records.get('grouped_by_prefix', 0)}, "
        f"standalone {records.get('standalone', 0)}",
        "- fell back to open-loop (conversations): "
        + (", ".join(f"{k} {v}" for k, v in sorted(fell.items())) or "none"),
        f"- conversations closed past the bound (evicted): {closed.get('evicted', 0)}",
        f"- turns completed: {closed.get('turns_completed', 0)}",
        f"- conversation duration, candidate/primary p50: {_fmt(closed.get('duration_ratio_p50'))}"
        f" (n={closed.get('duration_ratio_n', 0)})",
        f"- think time kept to |error| p50 {_fmt(think.get('p50'))} ms, max "
        f"{_fmt(think.get('max'))} ms (n={think.get('n', 0)})",
    ]
    if warmup and warmup.get("excluded"):
        lines.append(
            f"- warm-up: the first {warmup['excluded']} records sent were excluded from "
            "every count and verdict"
        )
    head = [
        "turn",
        "records",
        "TTFT candidate/primary p50",
        "e2e candidate/primary p50",
        "answer tokens candidate",
        "answer tokens primary",
        "cached share",
    ]
    rows = [
        [
            t["turn"],
            t["records"],
            t.get("ttft_ratio_p50"),
            t.get("e2e_ratio_p50"),
            t.get("candidate_tokens_mean"),
            t.get("primary_tokens_mean"),
            t.get("cached_share_mean"),
        ]
        for t in closed.get("per_turn") or []
    ]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return [*lines, ""]
