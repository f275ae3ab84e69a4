"""The outcome rules: complete, incomplete, cancelled or error, in their order of precedence."""

from __future__ import annotations

import json

import pytest

from shadow_proxy.exchange import EndKind, Route
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
        obs = observe(raw[:3000], raw[3000:], route=Route.COMPLETIONS, ctype=JSON,
                      max_unary_bytes=4096)  # fmt: skip
        assert obs.outcome == "incomplete"
        assert obs.body_problem == "body over 4096 bytes"


class TestCancelled:
    """The client going away makes the outcome cancelled; what arrived is kept."""

    def test_client_gone_mid_stream(self) -> None:
        obs = observe(sse(chat("abc"), done=False), sse(chat("de"), done=False),
                      end=EndKind.CLIENT_GONE)  # fmt: skip
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
        obs = observe(sse(chat("abc"), done=False), end=EndKind.UPSTREAM_BROKEN,
                      detail="connection reset")  # fmt: skip
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
