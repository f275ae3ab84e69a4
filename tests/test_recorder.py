"""The response recorder: decoding, per-choice accumulation, outcome rules, records."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.observed import ObservedResponse
from shadow_proxy.worker.response.recorder import ResponseRecorder

SSE = "text/event-stream"
JSON = "application/json"


def encode(text: str) -> list[int]:
    """A stand-in tokenizer: one id per character."""
    return [ord(c) for c in text]


def chat(
    content: str | None = None,
    *,
    index: int = 0,
    finish: str | None = None,
    rid: str = "chatcmpl-7",
    **delta: Any,
) -> dict[str, Any]:
    if content is not None:
        delta["content"] = content
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion.chunk", "choices": [choice]}


def comp(text: str = "", *, index: int = 0, finish: str | None = None, **extra: Any) -> dict:
    choice = {"index": index, "text": text, "finish_reason": finish, **extra}
    return {"id": "cmpl-3", "object": "text_completion", "choices": [choice]}


def sse(*objs: dict[str, Any] | str, done: bool = True, eol: str = "\n") -> bytes:
    parts = [f"data: {o if isinstance(o, str) else json.dumps(o)}{eol}{eol}" for o in objs]
    if done:
        parts.append(f"data: [DONE]{eol}{eol}")
    return "".join(parts).encode()


def observe(
    *chunks: bytes,
    route: Route = Route.CHAT,
    n: int = 1,
    status: int | None = 200,
    ctype: str = SSE,
    encoding: str = "",
    end: EndKind = EndKind.CLEAN,
    detail: str = "",
    chunk_timing: bool = True,
    **caps: Any,
) -> ObservedResponse:
    """Feed ``chunks`` at offsets 10, 20, ... ns; end at 1000."""
    recorder = ResponseRecorder(route, n, chunk_timing=chunk_timing, **caps)
    if status is not None:
        recorder.head(status, ctype, encoding, 5)
    for i, chunk in enumerate(chunks, 1):
        recorder.feed(chunk, 10 * i)
    return recorder.finish(end, 1000, detail)


def record(observed: ObservedResponse, **options: Any) -> dict[str, Any]:
    opts = {"tokens": True, "text": True, "max_tokens": None, "chunk_timing": True, **options}
    return observed.to_record(encode, **opts)


def has_none(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(has_none(v) for v in value.values())
    if isinstance(value, list):
        return any(has_none(v) for v in value)
    return False


CHAT_STREAM = [
    sse(chat(role="assistant", content="")),
    sse(chat("Hel"), chat("lo ")),
    sse(chat("wörld"), chat(finish="stop")),
    sse(
        {
            "id": "chatcmpl-7",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "prompt_tokens_details": None},
        }
    ),
]


class TestComplete:
    """A stream or body whose requested choices all finished is complete."""

    def test_chat_stream(self) -> None:
        obs = observe(*CHAT_STREAM)
        assert obs.outcome == "complete"
        assert obs.done_seen
        rec = record(obs)
        assert rec == {
            "outcome": "complete",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "output_tokens": 4,
                    "token_ids": encode("Hello wörld"),
                    "text": "Hello wörld",
                }
            ],
            "output_tokens": 4,
            "first_token_offset_ns": 20,
            "last_token_offset_ns": 30,
            "end_offset_ns": 1000,
            "chunk_offsets_ns": [20, 20, 30],
            "http_status": 200,
            "usage": {"prompt_tokens": 5, "completion_tokens": 4},
            "upstream_id": "chatcmpl-7",
            "token_ids_source": "retokenized",
            "output_tokens_source": "usage",
        }
        assert not has_none(rec)
        assert obs.choices[0].content_chunks == 3

    def test_completions_stream_with_crlf(self) -> None:
        body = sse(comp("a"), comp("b"), comp("", finish="length"), eol="\r\n")
        obs = observe(body, route=Route.COMPLETIONS)
        assert obs.outcome == "complete"
        rec = record(obs)
        assert rec["choices"] == [
            {
                "index": 0,
                "finish_reason": "length",
                "output_tokens": 2,
                "token_ids": encode("ab"),
                "text": "ab",
            }
        ]
        assert rec["upstream_id"] == "cmpl-3"

    def test_chat_unary(self) -> None:
        body = {
            "id": "chatcmpl-u",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hi"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
        raw = json.dumps(body).encode()
        obs = observe(raw[:7], raw[7:], ctype="application/json; charset=utf-8")
        assert obs.outcome == "complete"
        rec = record(obs)
        assert rec["choices"] == [
            {
                "index": 0,
                "finish_reason": "stop",
                "output_tokens": 1,
                "token_ids": encode("Hi"),
                "text": "Hi",
            }
        ]
        assert rec["first_token_offset_ns"] == rec["last_token_offset_ns"] == 20
        assert rec["upstream_id"] == "chatcmpl-u"

    def test_completions_unary_n2(self) -> None:
        body = {
            "id": "cmpl-u",
            "choices": [
                {"index": 1, "text": "yy", "finish_reason": "stop"},
                {"index": 0, "text": "x", "finish_reason": "length"},
            ],
        }
        obs = observe(json.dumps(body).encode(), route=Route.COMPLETIONS, n=2, ctype=JSON)
        assert obs.outcome == "complete"
        rec = record(obs)
        assert [c["index"] for c in rec["choices"]] == [0, 1]
        assert [c["output_tokens"] for c in rec["choices"]] == [1, 2]
        assert rec["output_tokens"] == 3


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


class TestContent:
    """What counts as output: content, reasoning, tool calls, upstream ids."""

    def test_tool_call_deltas(self) -> None:
        call = {"index": 0, "id": "call_1", "type": "function"}
        body = sse(
            chat(tool_calls=[{**call, "function": {"name": "get_weather", "arguments": ""}}]),
            chat(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
            chat(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]),
            chat(finish="tool_calls"),
        )
        obs = observe(body)
        assert obs.outcome == "complete"
        assert obs.choices[0].text == 'get_weather{"city": "Paris"}'
        assert obs.choices[0].content_chunks == 3
        assert obs.choices[0].finish_reason == "tool_calls"

    def test_reasoning_content_and_reasoning(self) -> None:
        body = sse(
            chat(reasoning_content="think "),
            chat(reasoning="more "),
            chat(reasoning_content="same ", reasoning="same "),
            chat("answer", finish="stop"),
        )
        obs = observe(body)
        assert obs.choices[0].text == "think more same answer"
        assert obs.first_token_offset_ns == 10

    def test_usage_only_chunk_is_not_content(self) -> None:
        usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
        obs = observe(
            sse(chat("ab", finish="stop")), sse({"id": "c", "choices": [], "usage": usage})
        )
        assert obs.usage == usage
        assert obs.last_token_offset_ns == 10
        assert list(obs.chunk_offsets_ns) == [10]
        assert record(obs)["output_tokens"] == 2

    def test_malformed_json_is_counted_not_fatal(self) -> None:
        obs = observe(sse(chat("a"), "{not json", "[1, 2]", chat(finish="stop")))
        assert obs.outcome == "complete"
        assert obs.malformed_events == 2

    def test_upstream_token_ids(self) -> None:
        """vLLM's ``return_token_ids``: ids on the choice, used as they are."""
        body = sse(
            {
                "id": "x",
                "choices": [{"index": 0, "delta": {"content": "ab"}, "token_ids": [11, 12]}],
            },
            {"id": "x", "choices": [{"index": 0, "delta": {"content": "c"}, "token_ids": [13]}]},
            {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        )
        obs = observe(body)
        calls: list[str] = []

        def spy(text: str) -> list[int]:
            calls.append(text)
            return encode(text)

        rec = obs.finalize(spy).to_record(tokens=True, text=False, max_tokens=2, chunk_timing=False)
        assert calls == []
        assert rec["token_ids_source"] == "upstream"
        assert rec["choices"] == [
            {
                "index": 0,
                "finish_reason": "stop",
                "output_tokens": 3,
                "token_ids": [11, 12],
                "truncated": True,
            }
        ]
        assert "chunk_offsets_ns" not in rec

    def test_nvext_token_ids_are_prompt_ids_not_output(self) -> None:
        chunk = chat("ab", finish="stop") | {"nvext": {"token_ids": [1, 2, 3, 4, 5]}}
        rec = record(observe(sse(chunk)))
        assert rec["token_ids_source"] == "retokenized"
        assert rec["choices"][0]["token_ids"] == encode("ab")

    def test_text_cap_keeps_counting(self) -> None:
        body = sse(*(chat("ééé") for _ in range(10)), chat(finish="stop"))
        obs = observe(body, max_text_bytes_per_choice=15)
        choice = obs.choices[0]
        assert choice.text == "é" * 7  # cut at a character boundary, not mid-character
        assert choice.text_truncated
        assert choice.content_chunks == 10
        rec = record(obs)
        assert rec["choices"][0]["text_truncated"] is True
        assert rec["choices"][0]["truncated"] is True
        assert rec["choices"][0]["output_tokens"] == 10  # at least the content chunks

    def test_total_text_cap_over_choices(self) -> None:
        body = sse(*(chat("abcd", index=i % 2) for i in range(10)))
        obs = observe(body, n=2, max_text_bytes_total=10)
        assert [c.text for c in obs.choices] == ["abcdab", "abcd"]
        assert [c.text_truncated for c in obs.choices] == [True, True]

    def test_choice_index_cap(self) -> None:
        body = sse(*(chat("a", index=i, finish="stop") for i in range(6)), chat("b", index="x"))
        obs = observe(body, max_choices=4)
        assert [c.index for c in obs.choices] == [0, 1, 2, 3]
        assert obs.ignored_choices == 3


class TestEncodings:
    """gzip and deflate bodies decode incrementally; bombs stay bounded."""

    def test_gzip_stream(self) -> None:
        raw = b"".join(CHAT_STREAM)
        packed = gzip.compress(raw)
        obs = observe(*(packed[i : i + 7] for i in range(0, len(packed), 7)), encoding="gzip")
        timing = ("first_token_offset_ns", "last_token_offset_ns", "chunk_offsets_ns")
        rec = {k: v for k, v in record(obs).items() if k not in timing}
        plain = {k: v for k, v in record(observe(raw)).items() if k not in timing}
        assert rec == plain
        assert rec["outcome"] == "complete"

    def test_gzip_with_several_members(self) -> None:
        raw = b"".join(CHAT_STREAM)
        packed = gzip.compress(raw[:100]) + gzip.compress(raw[100:])
        obs = observe(packed[:50], packed[50:], encoding="gzip")
        assert obs.outcome == "complete"
        assert obs.choices[0].text == "Hello wörld"

    @pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS])
    def test_deflate_unary_zlib_or_raw(self, wbits: int) -> None:
        body = json.dumps(comp("hello", finish="stop")).encode()
        packer = zlib.compressobj(wbits=wbits)
        packed = packer.compress(body) + packer.flush()
        obs = observe(packed[:1], packed[1:], route=Route.COMPLETIONS, ctype=JSON,
                      encoding="deflate")  # fmt: skip
        assert obs.outcome == "complete"
        assert obs.choices[0].text == "hello"

    def test_gzip_bomb_is_cut_at_the_unary_cap(self) -> None:
        packed = gzip.compress(b" " * (8 << 20))
        obs = observe(packed, ctype=JSON, encoding="gzip", max_unary_bytes=1 << 20)
        assert obs.body_problem == f"body over {1 << 20} bytes"

    def test_decompression_is_stepwise(self) -> None:
        """A small compressed chunk never expands into one huge buffer."""
        packed = gzip.compress(b"data: " + b"x" * (32 << 20))  # one 32 MiB line
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False, max_event_bytes=1 << 20)
        recorder.head(200, SSE, "gzip", 0)
        tracemalloc.start()
        try:
            recorder.feed(packed, 1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2 << 20
        observed = recorder.finish(EndKind.CLEAN, 2)
        assert observed.outcome == "incomplete"
        assert observed.truncated_events == 1


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


# A stream exercising multi-byte text, two choices, tool calls, ids, usage.
PROPERTY_STREAM = (
    sse(
        chat(role="assistant", content=""),
        chat("Grüße ", index=0),
        chat("🙂✓", index=1),
        chat(reasoning_content="hmm", index=0),
        chat(tool_calls=[{"index": 0, "function": {"name": "f", "arguments": "{}"}}], index=1),
        "{broken",
        chat("end", index=0, finish="stop"),
        chat(index=1, finish="tool_calls"),
        {"id": "x", "choices": [], "usage": {"completion_tokens": 12}},
        eol="\r\n",
    )
    + b": trailing comment\r\n\r\n"
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)], strict=True)]


def _same_offset_record(chunks: list[bytes], encoding: str = "") -> dict[str, Any]:
    recorder = ResponseRecorder(Route.CHAT, 2, chunk_timing=True)
    recorder.head(200, SSE, encoding, 0)
    for chunk in chunks:
        recorder.feed(chunk, 7)
    return record(recorder.finish(EndKind.CLEAN, 9))


REFERENCE = _same_offset_record([PROPERTY_STREAM])
GZIPPED = gzip.compress(PROPERTY_STREAM)


class TestAnySplit:
    """Any split of the body into chunks yields the same record."""

    def test_reference_is_what_we_expect(self) -> None:
        assert REFERENCE["outcome"] == "complete"
        assert [c["text"] for c in REFERENCE["choices"]] == ["Grüße hmmend", "🙂✓f{}"]
        assert REFERENCE["output_tokens"] == 12
        assert not has_none(REFERENCE)

    @settings(max_examples=100, deadline=None)
    @given(cuts=st.lists(st.integers(min_value=0, max_value=len(PROPERTY_STREAM)), max_size=20))
    def test_plain(self, cuts: list[int]) -> None:
        assert _same_offset_record(_split(PROPERTY_STREAM, cuts)) == REFERENCE

    @settings(max_examples=60, deadline=None)
    @given(cuts=st.lists(st.integers(min_value=0, max_value=len(GZIPPED)), max_size=20))
    def test_gzip(self, cuts: list[int]) -> None:
        assert _same_offset_record(_split(GZIPPED, cuts), "gzip") == REFERENCE
