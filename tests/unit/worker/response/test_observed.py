"""What a response looked like, settled once, and each tap's response map built from it."""

from __future__ import annotations

import pytest

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.recorder import ResponseRecorder
from tests.support.responses import (
    CHAT_STREAM,
    SSE,
    chat,
    encode,
    has_none,
    observe,
    record,
    sse,
)


class TestRecord:
    """Record building: optional fields, token counts, one tokenization per request."""

    def test_minimal_record_has_no_optional_fields(self) -> None:
        rec = record(observe(status=None, end=EndKind.CLIENT_GONE), chunk_timing=False)
        assert rec == {
            "outcome": "cancelled",
            "choices": [],
            "output_tokens": 0,
            "end_offset_ns": 1000,
            "token_ids_source": "retokenized",
        }

    def test_options_leave_fields_out(self) -> None:
        rec = record(observe(*CHAT_STREAM), tokens=False, text=False, chunk_timing=False)
        assert rec["choices"] == [{"index": 0, "finish_reason": "stop", "output_tokens": 4}]
        assert "chunk_offsets_ns" not in rec
        assert not has_none(rec)

    def test_chunk_offsets_need_recorder_timing(self) -> None:
        rec = record(observe(*CHAT_STREAM, chunk_timing=False), chunk_timing=True)
        assert "chunk_offsets_ns" not in rec

    def test_usage_apportioned_over_choices(self) -> None:
        usage = {"completion_tokens": 10}
        body = sse(
            chat("aaa", index=0, finish="stop"),
            chat("b", index=1, finish="stop"),
            chat("cc", index=2, finish="stop"),
            {"id": "u", "choices": [], "usage": usage},
        )
        rec = record(observe(body, n=3))
        counts = [c["output_tokens"] for c in rec["choices"]]
        assert sum(counts) == rec["output_tokens"] == 10
        assert counts == [5, 2, 3]  # 10 * 3/6 = 5, 10 * 1/6 = 1.67, 10 * 2/6 = 3.33

    def test_finalize_tokenizes_once_for_many_taps(self) -> None:
        calls: list[str] = []

        def spy(text: str) -> list[int]:
            calls.append(text)
            return encode(text)

        final = observe(*CHAT_STREAM).finalize(spy)
        records = [
            final.to_record(tokens=t, text=x, max_tokens=m, chunk_timing=c)
            for t, x, m, c in [
                (True, True, None, True),
                (True, False, 3, False),
                (False, True, 1, False),
            ]
        ]
        assert calls == ["Hello wörld"]
        assert records[1]["choices"][0]["token_ids"] == encode("Hel")
        assert records[1]["choices"][0]["truncated"] is True
        assert "token_ids" not in records[2]["choices"][0]

    def test_no_tokenization_when_usage_suffices(self) -> None:
        def fail(text: str) -> list[int]:
            raise AssertionError("must not tokenize")

        final = observe(*CHAT_STREAM).finalize(fail, token_ids=False)
        rec = final.to_record(tokens=False, text=False, max_tokens=None, chunk_timing=False)
        assert rec["output_tokens"] == 4
        with pytest.raises(ValueError, match="token ids were not computed"):
            final.to_record(tokens=True, text=False, max_tokens=None, chunk_timing=False)

    def test_tokenizer_failure_keeps_the_record(self) -> None:
        calls: list[str] = []

        def broken(text: str) -> list[int]:
            calls.append(text)
            raise RuntimeError("tokenizer exploded")

        body = sse(chat("abc"), chat("d", finish="stop"), chat("x", index=1, finish="stop"))
        obs = observe(body, n=2)
        final = obs.finalize(broken)
        assert len(calls) == 1  # not retried for every choice
        assert final.retokenize_error == "RuntimeError: tokenizer exploded"
        rec = final.to_record(tokens=True, text=False, max_tokens=None, chunk_timing=False)
        # Counted chunks, no ids: said so (issue 17 item 10).
        assert rec["choices"] == [
            {"index": 0, "finish_reason": "stop", "output_tokens": 2, "truncated": True},
            {"index": 1, "finish_reason": "stop", "output_tokens": 1, "truncated": True},
        ]
        assert rec["output_tokens_source"] == "chunks"
        assert "token_ids_source" not in rec

    def test_rejects_zero_max_tokens(self) -> None:
        final = observe(*CHAT_STREAM).finalize(encode)
        with pytest.raises(ValueError, match="max_tokens"):
            final.to_record(tokens=True, text=False, max_tokens=0, chunk_timing=False)

    def test_finish_is_idempotent(self) -> None:
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False)
        recorder.head(200, SSE, "", 1)
        recorder.feed(sse(chat("a", finish="stop")), 2)
        first = recorder.finish(EndKind.CLEAN, 3)
        recorder.feed(sse(chat("b")), 4)
        assert recorder.finish(EndKind.CLIENT_GONE, 5) is first
