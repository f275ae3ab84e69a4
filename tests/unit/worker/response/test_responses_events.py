"""Responses API answers read into records: typed events, the unary object, outcomes.

The fixtures are Dynamo 1.6.1's own bytes (``tests/data/dynamo/capture_responses.py``):
a mocker run to ``max_output_tokens``, a mocker refusing after the 200, and the
scripted worker's answer as text and as a function call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.observed import ObservedResponse
from shadow_proxy.worker.response.recorder import ResponseRecorder

DATA = Path(__file__).resolve().parents[3] / "data" / "dynamo" / "responses"
SSE = "text/event-stream"
JSON = "application/json"
CALL_TEXT = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


def events(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a captured stream, in order."""
    return [
        json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: {")
    ]


def frame(*objs: dict[str, Any], done: bool = True) -> bytes:
    """Events as Dynamo frames them (``event: TYPE`` then ``data``)."""
    parts = [f"event: {o['type']}\ndata: {json.dumps(o)}\n\n" for o in objs]
    if done:
        parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


def observe(
    data: bytes,
    *,
    ctype: str = SSE,
    status: int = 200,
    step: int = 0,
    end: EndKind = EndKind.CLEAN,
) -> ObservedResponse:
    """Feed ``data`` in pieces of ``step`` bytes (0: one piece per SSE event) at
    offsets 10, 20, ... ns; the exchange ends at 10**6 ns."""
    recorder = ResponseRecorder(Route.RESPONSES, 1, chunk_timing=True)
    recorder.head(status, ctype, "", 5)
    if step:
        pieces = [data[i : i + step] for i in range(0, len(data), step)]
    else:
        pieces = [p + b"\n\n" for p in data.split(b"\n\n") if p]
    for i, piece in enumerate(pieces, 1):
        recorder.feed(piece, 10 * i)
    return recorder.finish(end, 10**6, "")


def record(observed: ObservedResponse) -> dict[str, Any]:
    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    return observed.to_record(encode, tokens=True, text=True, max_tokens=None, chunk_timing=True)


def terminal(data: bytes) -> dict[str, Any]:
    """The ``response`` object of a stream's terminal event."""
    return events(data)[-1]["response"]


class TestDynamoStreams:
    """Dynamo's typed events: output, finish reason, outcome, usage and id."""

    def test_max_output_tokens_reached(self) -> None:
        data = fixture("stream_incomplete.sse")
        final = terminal(data)
        assert final["status"] == "incomplete"
        assert final["incomplete_details"] == {"reason": "max_output_tokens"}
        rec = record(observe(data))
        assert rec["outcome"] == "complete"
        [choice] = rec["choices"]
        assert choice["finish_reason"] == "length"
        assert choice["text"] == final["output"][0]["content"][0]["text"]
        assert rec["output_tokens"] == final["usage"]["output_tokens"] == 5
        assert rec["usage"] == final["usage"]
        assert rec["upstream_id"] == final["id"]
        assert rec["http_status"] == 200

    def test_completed_by_the_engine(self) -> None:
        data = fixture("stream_completed.sse")
        rec = record(observe(data))
        assert rec["outcome"] == "complete"
        assert rec["choices"][0]["finish_reason"] == "stop"
        assert rec["choices"][0]["text"] == CALL_TEXT
        assert rec["output_tokens"] == terminal(data)["usage"]["output_tokens"]

    def test_function_call(self) -> None:
        data = fixture("stream_function_call.sse")
        kinds = [e["type"] for e in events(data)]
        assert "response.function_call_arguments.delta" in kinds
        observed = observe(data)
        rec = record(observed)
        assert rec["outcome"] == "complete"
        [choice] = rec["choices"]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["text"] == 'get_weather{"city": "Paris"}'
        assert rec["output_tokens"] == terminal(data)["usage"]["output_tokens"]
        # The name arrives with the item, then one event per argument delta.
        deltas = kinds.count("response.function_call_arguments.delta")
        assert observed.choices[0].content_chunks == 1 + deltas

    def test_failed_after_the_200(self) -> None:
        data = fixture("stream_failed.sse")
        rec = record(observe(data))
        assert rec["outcome"] == "error"
        assert rec["error"] == terminal(data)["error"]["message"]
        assert "required by the mocker" in rec["error"]
        assert rec["choices"] == []
        assert rec["output_tokens"] == 0
        assert rec["upstream_id"].startswith("resp_")

    @pytest.mark.parametrize("step", [1, 7, 4096])
    def test_any_chunking_reads_the_same(self, step: int) -> None:
        data = fixture("stream_function_call.sse")
        whole = record(observe(data))
        again = record(observe(data, step=step))
        for key in ("outcome", "choices", "output_tokens", "usage", "upstream_id"):
            assert again[key] == whole[key]

    def test_offsets_are_those_of_output_events(self) -> None:
        data = fixture("stream_incomplete.sse")
        observed = observe(data)
        kinds = [e["type"] for e in events(data)]
        first = kinds.index("response.output_text.delta") + 1
        last = len(kinds) - kinds[::-1].index("response.output_text.delta")
        assert observed.first_token_offset_ns == 10 * first
        assert observed.last_token_offset_ns == 10 * last
        assert list(observed.chunk_offsets_ns) == [10 * i for i in range(first, last + 1)]

    def test_client_gone(self) -> None:
        data = fixture("stream_incomplete.sse")
        rec = record(observe(data[: len(data) // 2], end=EndKind.CLIENT_GONE))
        assert rec["outcome"] == "cancelled"
        assert "finish_reason" not in rec["choices"][0]

    def test_stream_cut_before_the_end(self) -> None:
        data = fixture("stream_incomplete.sse")
        cut = data[: data.index(b"event: response.incomplete")]
        rec = record(observe(cut))
        assert rec["outcome"] == "incomplete"
        assert rec["choices"][0]["output_tokens"] == len(rec["choices"][0]["text"])


class TestDynamoUnary:
    """The unary ``response`` object, per output item."""

    def test_max_output_tokens_reached(self) -> None:
        data = fixture("unary_incomplete.json")
        body = json.loads(data)
        rec = record(observe(data, ctype=JSON))
        assert rec["outcome"] == "complete"
        assert rec["choices"][0]["finish_reason"] == "length"
        assert rec["choices"][0]["text"] == body["output"][0]["content"][0]["text"]
        assert rec["output_tokens"] == body["usage"]["output_tokens"]
        assert rec["upstream_id"] == body["id"]
        assert rec["first_token_offset_ns"] == rec["last_token_offset_ns"]

    def test_function_call(self) -> None:
        data = fixture("unary_function_call.json")
        rec = record(observe(data, ctype=JSON, step=100))
        assert rec["outcome"] == "complete"
        assert rec["choices"][0]["finish_reason"] == "tool_calls"
        assert rec["choices"][0]["text"] == 'get_weather{"city": "Paris"}'
        assert rec["output_tokens"] == json.loads(data)["usage"]["output_tokens"]

    def test_refused_before_the_stream(self) -> None:
        body = {"message": "Validation: `background: true` is not supported.", "code": 501}
        rec = record(observe(json.dumps(body).encode(), ctype=JSON, status=501))
        assert (rec["outcome"], rec["http_status"]) == ("error", 501)
        assert rec["error"] == body["message"]
        assert rec["choices"] == []


def response(status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": [], **fields}


class TestOtherShapes:
    """Shapes Dynamo 1.6.1 does not send but other frontends (OpenAI's) do."""

    def test_openai_error_event(self) -> None:
        data = frame(
            {"type": "response.created", "response": response("in_progress")},
            {"type": "response.output_text.delta", "delta": "Hi"},
            {"type": "error", "code": "server_error", "message": "boom", "param": None},
            done=False,
        )
        rec = record(observe(data))
        assert (rec["outcome"], rec["error"]) == ("error", "boom")
        assert rec["choices"][0]["text"] == "Hi"

    def test_unnamed_events_are_read_by_type(self) -> None:
        """Without ``event:`` lines (plain ``data:`` frames) the ``type`` decides;
        the first response id is kept."""
        objs = [
            {"type": "response.created", "response": response("in_progress")},
            {"type": "response.output_text.delta", "delta": "Hi"},
            {"type": "response.in_progress", "response": {**response("x"), "id": "resp_2"}},
            {"type": "error", "code": "server_error", "message": "boom"},
        ]
        data = "".join(f"data: {json.dumps(o)}\n\n" for o in objs).encode()
        rec = record(observe(data))
        assert (rec["outcome"], rec["error"]) == ("error", "boom")
        assert rec["upstream_id"] == "resp_1"

    def test_content_filter_and_other_reasons(self) -> None:
        for reason, expected in (("content_filter", "content_filter"), ("other", "other")):
            final = response("incomplete", incomplete_details={"reason": reason})
            data = frame({"type": "response.incomplete", "response": final})
            rec = record(observe(data))
            assert rec["choices"][0]["finish_reason"] == expected
            assert rec["outcome"] == "complete"

    def test_cancelled_status_is_not_complete(self) -> None:
        data = frame({"type": "response.cancelled", "response": response("cancelled")})
        rec = record(observe(data))
        assert rec["choices"][0]["finish_reason"] == "cancelled"
        assert rec["outcome"] == "incomplete"

    def test_output_of_the_terminal_event_stands_in_for_missing_deltas(self) -> None:
        output = [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think "}]},
            {
                "type": "message",
                "content": [
                    {"type": "output_text", "text": "hello"},
                    {"type": "refusal", "refusal": "!"},
                ],
            },
            {"type": "function_call", "name": "f", "arguments": "{}"},
        ]
        usage = {"input_tokens": 3, "output_tokens": 9}
        final = response("completed", output=output, usage=usage)
        rec = record(observe(frame({"type": "response.completed", "response": final})))
        assert rec["choices"][0]["text"] == "think hello!f{}"
        assert rec["choices"][0]["finish_reason"] == "tool_calls"
        assert rec["output_tokens"] == 9

    def test_reasoning_and_refusal_deltas_are_output(self) -> None:
        data = frame(
            {"type": "response.reasoning_summary_text.delta", "delta": "a"},
            {"type": "response.reasoning_text.delta", "delta": "b"},
            {"type": "response.refusal.delta", "delta": "c"},
            {"type": "response.output_text.done", "text": "never counted"},
            {"type": "response.completed", "response": response("completed")},
        )
        rec = record(observe(data))
        assert rec["choices"][0]["text"] == "abc"

    def test_malformed_events_are_counted(self) -> None:
        data = b"event: response.output_text.delta\ndata: {nope\n\ndata: [1]\n\n" + frame(
            {"type": "response.completed", "response": response("completed")}
        )
        observed = observe(data)
        assert observed.malformed_events == 2
        assert observed.done_seen
        assert observed.outcome == "complete"
