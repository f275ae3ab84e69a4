"""The demo's accounting rules: a run fails, saying why, when one does not hold."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shadow_proxy.devtools.demo.checks import evaluate


def _good_result() -> dict[str, Any]:
    taps = {
        "kv-history-tracker": {
            "records": 10,
            "prompt_tokens": 500,
            "output_tokens": 0,
            "outcomes": {},
            "tap_gaps": 0,
            "transport_gaps": 0,
            "tail_loss": 0,
            "transport_tail_loss": 0,
            "duplicates": 0,
            "undecodable": {},
        },
        "shadow-replay": {
            "records": 10,
            "prompt_tokens": 500,
            "output_tokens": 80,
            "outcomes": {"complete": 8, "cancelled": 2},
            "tap_gaps": 0,
            "transport_gaps": 0,
            "tail_loss": 0,
            "transport_tail_loss": 0,
            "duplicates": 0,
            "undecodable": {},
        },
    }
    return {
        "clients": {
            "requests": 10,
            "ok": 8,
            "cancelled": 2,
            "errors": 0,
            "frontend_prompt_tokens": 500,
            "prompt_tokens_uncounted": 0,
        },
        "taps": taps,
        "proxy": {
            "taps": {name: {"queued": 10, "published": 10} for name in taps},
            "prompt_token_mismatches": 0,
            "handoff_dropped": {},
        },
        "exit_status": {"proxy": 0, "consumer-kv-history-tracker": 0},
    }


class TestEvaluate:
    """The run fails, saying why, when any part of the accounting does not hold."""

    def test_a_good_run_passes(self):
        assert evaluate(_good_result()) == []

    def test_a_cancel_after_the_whole_answer_is_complete(self):
        """The client hung up after the proxy had written the whole answer."""
        result = copy.deepcopy(_good_result())
        result["taps"]["shadow-replay"]["outcomes"] = {"complete": 9, "cancelled": 1}
        assert evaluate(result) == []

    def test_error_records_say_what_they_said(self):
        """An error record's failure line carries the messages the consumer
        counted, so a run that fails once says why."""
        result = copy.deepcopy(_good_result())
        tap = result["taps"]["shadow-replay"]
        tap["outcomes"] = {"complete": 8, "cancelled": 1, "error": 1}
        tap["errors"] = {"upstream connection broke": 1}
        failures = evaluate(result)
        assert "shadow-replay: 1 error records (upstream connection broke 1)" in failures

    @pytest.mark.parametrize(
        ("path", "value", "expected"),
        [
            (("taps", "kv-history-tracker", "records"), 9, "9 records for 10 requests"),
            (("taps", "shadow-replay", "tap_gaps"), 1, "tap_gaps = 1"),
            (("taps", "shadow-replay", "transport_gaps"), 2, "transport_gaps = 2"),
            (("taps", "kv-history-tracker", "tail_loss"), 1, "tail_loss = 1"),
            (("taps", "shadow-replay", "prompt_tokens"), 499, "the frontend reports 500"),
            (("clients", "errors"), 1, "1 client requests failed"),
            (("proxy", "prompt_token_mismatches"), 3, "3 prompt mismatches"),
            (("exit_status", "proxy"), -9, "proxy exited with status -9"),
            (
                ("taps", "shadow-replay", "outcomes"),
                {"complete": 8, "error": 2},
                "8 complete and 0 cancelled records, the clients saw 8 answered and 2 cancelled",
            ),
            (
                ("taps", "shadow-replay", "outcomes"),
                {"complete": 7, "cancelled": 3},
                "7 complete and 3 cancelled records",
            ),
            (
                ("proxy", "taps", "shadow-replay", "dropped"),
                {"full": 1},
                "the proxy dropped records full 1",
            ),
        ],
    )
    def test_a_broken_rule_fails(self, path, value, expected):
        result = copy.deepcopy(_good_result())
        target = result
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        failures = evaluate(result)
        assert any(expected in f for f in failures), failures
