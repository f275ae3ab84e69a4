"""The demo's table: every section, the numbers formatted, the verdict last."""

from __future__ import annotations

from typing import Any

import pytest

from shadow_proxy.devtools.demo.table import counts, format_table, number


def result(ok: bool = True) -> dict[str, Any]:
    tap = {
        "records": 10,
        "prompt_tokens": 5120,
        "output_tokens": 0,
        "outcomes": {},
        "tap_gaps": 0,
        "transport_gaps": 0,
        "tail_loss": 0,
        "transport_tail_loss": 0,
    }
    replay = {
        **tap,
        "output_tokens": 80,
        "outcomes": {"complete": 8, "cancelled": 2},
        "tail_loss": 1,
    }
    return {
        "title": "streaming, 25% cancelled",
        "load": {
            "requests": 10,
            "concurrency": 4,
            "isl": 512,
            "osl": 32,
            "stream": True,
            "cancel_fraction": 0.25,
            "model": "deepseek",
            "frontend": "http://f",
        },
        "clients": {
            "requests": 10,
            "ok": 8,
            "cancelled": 2,
            "errors": 0,
            "prompt_tokens": 4096,
            "frontend_prompt_tokens": 5120,
            "prompt_tokens_asked_again": 2,
            "completion_tokens": 256,
            "requests_per_s": 12.345,
            "ttft_p50_ms": 21.0,
            "ttft_p99_ms": None,
            "e2e_p50_ms": 100.0,
            "e2e_p99_ms": 150.5,
        },
        "proxy": {
            "requests": {"chat 2xx": 10},
            "client_disconnects": 2,
            "upstream_errors": {"connect": 0},
            "not_mirrored": {},
            "prompt_token_checks": 8,
            "prompt_token_mismatches": 0,
            "handoff_dropped": {"full": 0},
            "worker_restarts": 0,
            "taps": {"kv-history-tracker": {"queued": 10, "published": 10, "dropped": {"full": 0}}},
        },
        "taps": {"kv-history-tracker": tap, "shadow-replay": replay},
        "timings_s": {"startup_s": 8.94, "load_s": 1.0},
        "ok": ok,
        "failures": [] if ok else ["shadow-replay: tail_loss = 1", "proxy exited with status 1"],
    }


class TestFormatting:
    """Integers with separators, floats with one decimal, None as a dash."""

    @pytest.mark.parametrize(
        ("value", "text"),
        [
            (None, "-"),
            (True, "yes"),
            (False, "no"),
            (102200, "102,200"),
            (12.345, "12.3"),
            ("x", "x"),
        ],
    )
    def test_number(self, value: object, text: str) -> None:
        assert number(value) == text

    def test_counts_leave_out_zeros(self) -> None:
        assert counts({"full": 0, "closed": 1200, "evicted": 3}) == "closed 1,200, evicted 3"
        assert counts({"full": 0}) == counts(None) == counts({}) == "none"


class TestTable:
    """The sections in order, the load line, the taps as a grid, and the verdict."""

    def test_sections_and_verdict(self) -> None:
        text = format_table(result())
        lines = text.splitlines()
        assert lines[0] == (
            "== streaming, 25% cancelled: 10 requests, concurrency 4, ISL 512, OSL 32, "
            "chat, streaming, 25% cancelled"
        )
        assert lines[1] == "   frontend http://f, model deepseek, taps over ZeroMQ"
        for heading in ("clients", "proxy /metrics", "taps (consumer totals)"):
            assert heading in lines
        assert "  sent / ok / cancelled / errors       10 / 8 / 2 / 0" in lines
        assert (
            "  prompt tokens the frontend reports   5,120  (+2 without usage, asked again)" in lines
        )
        assert "  TTFT p50 / p99 ms                    21.0 / -" in lines
        assert "  hand-off drops / worker restarts  none / 0" in lines
        assert "  tap kv-history-tracker            queued 10, published 10, dropped none" in lines
        assert (
            "  shadow-replay            10       5,120          80         0               0"
            "          1  complete 8, cancelled 2"
        ) in lines
        assert lines[-2] == "timings  startup 8.9 s, load 1.0 s"
        assert lines[-1].startswith("OK: each tap holds 10 records, no gap, no loss")

    def test_failures_are_listed(self) -> None:
        lines = format_table(result(ok=False)).splitlines()
        assert lines[-3:] == [
            "FAILED:",
            "  - shadow-replay: tail_loss = 1",
            "  - proxy exited with status 1",
        ]

    def test_first_byte_when_not_streaming(self) -> None:
        unary = result()
        unary["load"]["stream"] = False
        unary["load"]["cancel_fraction"] = 0.0
        text = format_table(unary)
        assert "first byte p50 / p99 ms" in text and "TTFT" not in text
        assert text.splitlines()[0].endswith("OSL 32, chat, not streaming")

    def test_responses_over_jetstream(self) -> None:
        run = result()
        run["load"].update(api="responses", transport="nats")
        lines = format_table(run).splitlines()
        assert lines[0].endswith("OSL 32, Responses API, streaming, 25% cancelled")
        assert lines[1].endswith("taps over NATS JetStream")

    def test_multi_turn_and_its_sections(self) -> None:
        """The multi-turn run names its conversations; its sections come before the
        timings and the verdict."""
        run = result()
        run["kind"] = "multi-turn"
        run["load"].update(requests=12, conversations=4, turns=3, cancel_fraction=0.0)
        lines = format_table(run, ["", "reuse", "  the reuse grid"]).splitlines()
        assert lines[0] == (
            "== streaming, 25% cancelled: 12 requests (4 conversations at once, 3 turns each, "
            "every turn resending its history), OSL 32, chat, streaming"
        )
        assert lines[-6:-2] == ["", "reuse", "  the reuse grid", ""]
        assert lines[-2].startswith("timings")
