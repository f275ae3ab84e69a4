"""Observations and joined records for the shadow-replay tests."""

from __future__ import annotations

from typing import Any

from shadow_proxy.replay.compare import Observation

ARRIVAL_NS = 1_700_000_000_000_000_000


def observation(
    ttft: float, ids: tuple[int, ...] = (1, 2), error: str | None = None
) -> Observation:
    """One deployment's answer: ``ids`` as its output, latencies derived from ``ttft``
    (ms), an error answer (503) with ``error``."""
    return Observation(
        outcome="error" if error else "complete",
        finish_reasons=("length",),
        output_tokens=len(ids),
        exact_tokens=len(ids),
        token_ids=(ids,),
        ttft_ms=ttft,
        itl_ms=ttft / 10,
        e2e_ms=ttft * 2,
        prompt_tokens=5,
        http_status=503 if error else 200,
        error=error,
        error_kind="http" if error else None,
    )


def joined_record(
    seq: int,
    text: str,
    *,
    max_tokens: int,
    model: str = "deepseek",
    arrival_ms: float = 0.0,
    response: bool = True,
) -> dict[str, Any]:
    """A joined record whose primary answered ``text`` (one choice, ``max_tokens``
    long, cut by length) to a five-token prompt; request-only without ``response``."""
    record: dict[str, Any] = {
        "schema_version": 1,
        "tap": "joined",
        "seq": seq,
        "request_id": f"rid-{seq}",
        "origin": "completions",
        "filters": [],
        "arrival_unix_ns": ARRIVAL_NS + int(arrival_ms * 1e6),
        "request": {
            "model": model,
            "token_ids": [1, 2, 3, 4, 5],
            "stop_conditions": {"max_tokens": max_tokens},
            "sampling_options": {},
        },
    }
    if response:
        record["response"] = {
            "outcome": "complete",
            "choices": [
                {"index": 0, "finish_reason": "length", "output_tokens": max_tokens, "text": text}
            ],
            "output_tokens": max_tokens,
            "first_token_offset_ns": 10_000_000,
            "last_token_offset_ns": 10_000_000 + 2_000_000 * (max_tokens - 1),
            "end_offset_ns": 12_000_000 + 2_000_000 * max_tokens,
            "http_status": 200,
            "usage": {"prompt_tokens": 5, "completion_tokens": max_tokens},
        }
    return record
