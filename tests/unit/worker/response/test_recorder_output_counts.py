"""The record says which output counts are exact and which estimated, and never
leaves token ids short of the count unsaid (issue 17 item 10)."""

from __future__ import annotations

import json

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.recorder import ResponseRecorder


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n"
    )


def chunk(text: str, finish: str | None = None, ids: list[int] | None = None) -> dict:
    choice: dict = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": "x", "choices": [choice]}


def record(body: bytes) -> dict:
    recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False)
    recorder.head(200, "text/event-stream", "", 1)
    recorder.feed(body, 2)
    observed = recorder.finish(EndKind.CLEAN, 3, "")
    final = observed.finalize(lambda text: list(range(len(text.split()))))
    return final.to_record(tokens=True, text=False, max_tokens=None, chunk_timing=False)


class TestSources:
    def test_usage_is_exact_and_short_ids_are_truncated(self) -> None:
        usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}
        rec = record(sse(chunk("a b"), chunk(" c", "stop"), usage))
        assert rec["output_tokens_source"] == "usage"
        assert rec["token_ids_source"] == "retokenized"
        assert rec["choices"][0]["output_tokens"] == 5
        assert len(rec["choices"][0]["token_ids"]) == 3
        assert rec["choices"][0]["truncated"] is True

    def test_retokenized_is_an_estimate(self) -> None:
        rec = record(sse(chunk("a b"), chunk(" c", "stop")))
        assert rec["output_tokens_source"] == "retokenized"
        assert "truncated" not in rec["choices"][0]

    def test_upstream_ids_are_exact(self) -> None:
        rec = record(sse(chunk("a", ids=[7]), chunk("b", "stop", ids=[8])))
        assert rec["output_tokens_source"] == "upstream"
        assert rec["choices"][0]["token_ids"] == [7, 8]
        assert "truncated" not in rec["choices"][0]


class TestNotEncoded:
    """``finalize(None)`` (a response cut by a work budget): nothing is encoded and
    nothing fails; counts are content chunks, no ids, upstream ids still kept."""

    def observed(self, body: bytes):
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False)
        recorder.head(200, "text/event-stream", "", 1)
        recorder.feed(body, 2)
        return recorder.finish(EndKind.CLEAN, 3, "")

    def test_counted_by_chunks(self) -> None:
        final = self.observed(sse(chunk("a b"), chunk(" c d"), chunk(" e"))).finalize(None)
        assert final.retokenize_error is None
        assert final.output_tokens == (3,) and final.output_tokens_source == "chunks"
        assert final.token_ids == (None,) and final.token_ids_source is None

    def test_upstream_ids_kept(self) -> None:
        final = self.observed(sse(chunk("a", ids=[7]), chunk("b", "stop", ids=[8]))).finalize(None)
        assert list(final.token_ids[0]) == [7, 8]
        assert final.token_ids_source == "upstream" and final.retokenize_error is None
