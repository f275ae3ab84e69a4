"""The outcome rules: complete, incomplete, cancelled or error, in their order of precedence."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response import outcome
from tests.support.responses import (
    JSON,
    chat,
    comp,
    encode,
    has_none,
    observe,
    record,
    sse,
)


class TestIncomplete:
    """A clean end without every requested choice finished is incomplete."""

    def test_n2_with_one_choice_unfinished(self) -> None:
        body = sse(chat("a", index=0), chat("b", index=1), chat(finish="stop", index=0))
        obs = observe(body, n=2)
        assert obs.outcome == "incomplete"
        assert obs.error is None
        assert [c.finish_reason for c in obs.choices] == ["stop", None]

    def test_n2_both_finished_is_complete(self) -> None:
        body = sse(chat("a", index=0, finish="stop"), chat("b", index=1, finish="stop"))
        assert observe(body, n=2).outcome == "complete"

    def test_stream_without_finish_reason(self) -> None:
        obs = observe(sse(chat("a"), chat("b")))
        assert obs.outcome == "incomplete"
        rec = record(obs)
        assert "finish_reason" not in rec["choices"][0]

    def test_aborted_choice_is_not_finished(self) -> None:
        assert observe(sse(chat("a", finish="abort"))).outcome == "incomplete"

    def test_undecodable_encoding(self) -> None:
        obs = observe(b"\x1b\x02\x00garbage", encoding="br")
        assert obs.outcome == "incomplete"
        assert obs.undecodable_bytes == 10
        assert "br" in (obs.body_problem or "")

    def test_unary_body_over_cap(self) -> None:
        raw = json.dumps(comp("z" * 5000, finish="stop")).encode()
        obs = observe(
            raw[:3000], raw[3000:], route=Route.COMPLETIONS, ctype=JSON, max_unary_bytes=4096
        )
        assert obs.outcome == "incomplete"
        assert obs.body_problem == "body over 4096 bytes"


class TestCancelled:
    """The client going away makes the outcome cancelled; what arrived is kept."""

    def test_client_gone_mid_stream(self) -> None:
        obs = observe(
            sse(chat("abc"), done=False), sse(chat("de"), done=False), end=EndKind.CLIENT_GONE
        )
        assert obs.outcome == "cancelled"
        rec = record(obs)
        assert rec["choices"] == [
            {"index": 0, "output_tokens": 5, "token_ids": encode("abcde"), "text": "abcde"}
        ]
        assert rec["last_token_offset_ns"] == 20

    def test_client_gone_wins_over_finish_and_error(self) -> None:
        body = sse(chat("a", finish="stop"), {"error": {"message": "late"}})
        obs = observe(body, end=EndKind.CLIENT_GONE)
        assert obs.outcome == "cancelled"


class TestError:
    """Error statuses, error events and bodies, and failed connections are errors."""

    def test_500_with_openai_error_body(self) -> None:
        body = json.dumps({"error": {"message": "engine overloaded", "code": 500}}).encode()
        obs = observe(body, status=500, ctype=JSON)
        assert (obs.outcome, obs.error) == ("error", "engine overloaded")
        rec = record(obs)
        assert rec["http_status"] == 500
        assert rec["error"] == "engine overloaded"
        assert rec["choices"] == []
        assert not has_none(rec)

    def test_400_with_detail_body(self) -> None:
        body = json.dumps({"detail": "model not found"}).encode()
        obs = observe(body, status=404, ctype=JSON)
        assert (obs.outcome, obs.error) == ("error", "model not found")

    def test_error_status_with_plain_text(self) -> None:
        obs = observe(b"Bad Gateway", status=502, ctype="text/plain")
        assert (obs.outcome, obs.error) == ("error", "Bad Gateway")

    def test_error_status_without_body(self) -> None:
        obs = observe(b"  \n", status=503, ctype=JSON)
        assert (obs.outcome, obs.error) == ("error", "HTTP 503")
        assert obs.malformed_events == 0

    def test_broken_stream(self) -> None:
        obs = observe(
            sse(chat("abc"), done=False), end=EndKind.UPSTREAM_BROKEN, detail="connection reset"
        )
        assert (obs.outcome, obs.error) == ("error", "connection reset")
        assert record(obs)["choices"][0]["text"] == "abc"

    @pytest.mark.parametrize(
        ("end", "message"),
        [
            (EndKind.TIMEOUT, "upstream read timed out"),
            (EndKind.SHUTDOWN, "proxy shut down"),
            (EndKind.UPSTREAM_FAILED, "upstream request failed"),
            (EndKind.CAPTURE_LOST, "capture lost"),
        ],
    )
    def test_failed_ends(self, end: EndKind, message: str) -> None:
        obs = observe(sse(chat("a", finish="stop")), end=end)
        assert (obs.outcome, obs.error) == ("error", message)

    def test_upstream_failed_before_head(self) -> None:
        obs = observe(status=None, end=EndKind.UPSTREAM_FAILED, detail="connect refused")
        assert (obs.outcome, obs.error, obs.http_status) == ("error", "connect refused", None)
        assert "http_status" not in record(obs)

    def test_dynamo_error_event_mid_stream(self) -> None:
        body = (
            sse(chat("par"), done=False)
            + b"event: error\n: worker 7 died\n\n"
            + b"data: [DONE]\n\n"
        )
        obs = observe(body)
        assert (obs.outcome, obs.error) == ("error", "worker 7 died")
        assert obs.choices[0].text == "par"

    def test_error_object_in_data_mid_stream(self) -> None:
        body = sse(chat("a"), {"error": {"message": "x" * 2000, "type": "internal"}})
        obs = observe(body)
        assert obs.outcome == "error"
        assert len(obs.error or "") == 512

    def test_error_finish_reason(self) -> None:
        obs = observe(sse(chat("a", finish="error")))
        assert obs.outcome == "error"
        assert obs.error == "choice 0 finished with 'error'"

    def test_error_on_one_of_two_choices(self) -> None:
        body = sse(chat("a", index=0, finish="stop"), chat("b", index=1, finish="error"))
        assert observe(body, n=2).outcome == "error"

    def test_corrupt_gzip(self) -> None:
        obs = observe(b"\x1f\x8b\x08\x00garbage-garbage", encoding="gzip")
        assert obs.outcome == "incomplete"
        assert (obs.body_problem or "").startswith("corrupt gzip")


def decide(end: EndKind = EndKind.CLEAN, detail: str = "", **given: Any) -> tuple[str, str | None]:
    args = {"status": 200, "error": None, "finished": [(0, "stop")], "n": 1, "problem": None}
    return outcome.decide(end, detail, **{**args, **given})


class TestDecide:
    """The rules in order of precedence, called directly."""

    def test_complete(self) -> None:
        assert decide() == ("complete", None)
        assert decide(finished=[(0, "length"), (1, "stop")], n=2) == ("complete", None)

    def test_client_gone_wins_over_everything(self) -> None:
        assert decide(EndKind.CLIENT_GONE, status=500, error="boom") == ("cancelled", "boom")

    def test_capture_lost(self) -> None:
        assert decide(EndKind.CAPTURE_LOST) == ("error", "capture lost")
        assert decide(EndKind.CAPTURE_LOST, "full") == ("error", "capture lost: full")

    def test_error_status(self) -> None:
        assert decide(status=503) == ("error", "HTTP 503")
        assert decide(status=503, error="overloaded") == ("error", "overloaded")
        assert decide(EndKind.UPSTREAM_FAILED, "connect timeout", status=504) == (
            "error",
            "connect timeout",
        )

    def test_error_in_the_body_wins_over_finished_choices(self) -> None:
        assert decide(error="worker died") == ("error", "worker died")

    @pytest.mark.parametrize("end", list(outcome.END_ERRORS))
    def test_failed_ends(self, end: EndKind) -> None:
        assert decide(end) == ("error", outcome.END_ERRORS[end])
        assert decide(end, "read timeout") == ("error", "read timeout")

    def test_a_choice_finished_with_an_error(self) -> None:
        assert decide(finished=[(0, "stop"), (1, "error: oom")], n=2) == (
            "error",
            "choice 1 finished with 'error: oom'",
        )

    def test_incomplete(self) -> None:
        assert decide(finished=[(0, "stop")], n=2) == ("incomplete", None)
        assert decide(finished=[(0, None)]) == ("incomplete", None)
        assert decide(finished=[(0, "abort")]) == ("incomplete", None)
        assert decide(problem="unary body over the cap") == (
            "incomplete",
            "unary body over the cap",
        )
        assert decide(problem="") == ("incomplete", None)


class TestErrorMessage:
    """The error a body carries, in the forms frontends use; long ones clipped."""

    @pytest.mark.parametrize(
        ("body", "detail", "message"),
        [
            ({"error": {"message": "nope", "code": 400}}, False, "nope"),
            ({"error": {"code": 500}}, False, '{"code": 500}'),
            ({"error": "plain"}, False, "plain"),
            ({"object": "error", "message": "vllm style"}, False, "vllm style"),
            ({"detail": "fastapi"}, True, "fastapi"),
            ({"detail": [{"loc": 1}]}, True, '[{"loc": 1}]'),
            ({"detail": "fastapi"}, False, None),
            ({"choices": []}, False, None),
            (["not", "an", "object"], False, None),
        ],
    )
    def test_forms(self, body: Any, detail: bool, message: str | None) -> None:
        assert outcome.error_message(body, detail=detail) == message

    def test_clip(self) -> None:
        long = "x" * 1000
        clipped = outcome.clip(long)
        assert len(clipped) == outcome.MAX_ERROR_CHARS and clipped.endswith("...")
        assert outcome.clip("short") == "short"

    def test_error_reasons(self) -> None:
        assert outcome.is_error_reason("error") and outcome.is_error_reason("error: x")
        assert not outcome.is_error_reason("stop") and not outcome.is_error_reason("errors")
