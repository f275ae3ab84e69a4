"""The response recorder: a stream read as the client received it, per choice, any chunking."""

from __future__ import annotations

import gzip
import itertools
import json
from typing import Any, ClassVar

from hypothesis import given, settings
from hypothesis import strategies as st

from shadow_proxy.channel.handoff import Pieces
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.recorder import ResponseRecorder
from tests.support import ROOT
from tests.support.responses import (
    CHAT_STREAM,
    JSON,
    SSE,
    chat,
    comp,
    encode,
    has_none,
    observe,
    record,
    sse,
)
from tests.unit.worker.response.test_fast_chunk import chunks as generated
from tests.unit.worker.response.test_fast_chunk import shaped


class TestTiming:
    """What the record's offsets were measured from: when the proxy sent the request
    to the frontend, and whether the answer streamed."""

    def test_upstream_send(self) -> None:
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False)
        recorder.head(200, SSE, "", 900, sent_offset_ns=300)
        recorder.feed(sse(chat("Hi"), chat(finish="stop")), 1_500)
        rec = record(recorder.finish(EndKind.CLEAN, 2_000))
        assert rec["upstream_sent_offset_ns"] == 300 and rec["streamed"] is True
        assert rec["first_token_offset_ns"] == 1_500

    def test_not_sent_upstream(self) -> None:
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False)
        recorder.head(502, "application/json", "", 900)  # the proxy answered itself
        rec = record(recorder.finish(EndKind.UPSTREAM_FAILED, 1_000))
        assert "upstream_sent_offset_ns" not in rec and rec["streamed"] is False
        no_head = record(
            ResponseRecorder(Route.CHAT, 1, chunk_timing=False).finish(EndKind.CLIENT_GONE, 5)
        )
        assert "streamed" not in no_head and "upstream_sent_offset_ns" not in no_head


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
            "streamed": True,
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
        assert rec["streamed"] is False  # a JSON body: its first token came with all of it

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


GZIPPED = gzip.compress(PROPERTY_STREAM, mtime=0)


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


class TestFeedMany:
    """``feed_many`` of a message's chunks gives the very record ``feed`` of each does,
    for any chunking, any budget, and the Dynamo capture."""

    CAPTURE = (ROOT / "tests" / "data" / "dynamo" / "chat_stream_usage.sse").read_bytes()

    @staticmethod
    def observed(chunks: list[bytes], batch: int, many: bool, **caps: Any) -> Any:
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=True, **caps)
        recorder.head(200, "text/event-stream", "", 1)
        for start in range(0, len(chunks), batch):
            part = chunks[start : start + batch]
            offsets = list(range(start, start + len(part)))
            if many:
                recorder.feed_many(Pieces.of(part), offsets)
            else:
                for chunk, offset in zip(part, offsets, strict=True):
                    recorder.feed(chunk, offset)
        return recorder.finish(EndKind.CLEAN, 10_000), recorder.gave_up

    @settings(max_examples=150, deadline=None)
    @given(
        cuts=st.lists(st.integers(0, 4000), max_size=12),
        events=st.sampled_from([None, 3, 9]),
        batch=st.integers(1, 5),
        whole=st.booleans(),
    )
    def test_same_record(self, cuts, events, batch, whole) -> None:
        body = self.CAPTURE
        if whole:  # at event boundaries, as Dynamo's chunks come
            pieces = [e + b"\n\n" for e in body.split(b"\n\n") if e]
            chunks = []
            for size in [1 + c % 3 for c in cuts] + [1] * len(pieces):
                if pieces:
                    chunks.append(b"".join(pieces[:size]))
                    del pieces[:size]
        else:
            bounds = sorted({c % len(body) for c in cuts} | {0, len(body)})
            chunks = [body[a:b] for a, b in itertools.pairwise(bounds)]
        caps = {"max_events": events}
        assert self.observed(chunks, batch, True, **caps) == self.observed(
            chunks, batch, False, **caps
        )


#: A chunk with a tool call (or a legacy function call) the general parser reads.
tool_call = st.builds(
    lambda key, name, args: {
        "id": "chatcmpl-7",
        "choices": [
            {
                "index": 0,
                "delta": {
                    key: [{"index": 0, "function": {"name": name, "arguments": args}}]
                    if key == "tool_calls"
                    else {"name": name, "arguments": args}
                },
            }
        ],
    },
    st.sampled_from(["tool_calls", "function_call"]),
    st.sampled_from(["", "get"]),
    st.sampled_from(["", '{"a":', "1}"]),
)


class TestBatch:
    """A message of whole one-line data events is read in one decode and one pass
    (``SSEParser.whole_events``, ``fast_chunk.read_batch``): the record is the one
    ``feed`` of each chunk gives, for any mix of chunks (tool calls, usage, errors,
    several choices, chunks the structs do not describe) under small caps."""

    CAPS: ClassVar[dict[str, int]] = {
        "max_text_bytes_per_choice": 40,
        "max_text_bytes_total": 60,
        "max_token_ids_per_choice": 6,
        "max_token_ids_total": 9,
        "max_choices": 3,
    }

    @staticmethod
    def observed(
        chunks: list[bytes], sizes: list[int], route: Route, many: bool, timing: bool, **caps: Any
    ) -> Any:
        recorder = ResponseRecorder(route, 2, chunk_timing=timing, **caps)
        recorder.head(200, "text/event-stream", "", 1)
        recorder.feed(b": keep-alive\n\n", 2)  # as Dynamo opens a stream: the BOM is settled
        start = 0
        for size in itertools.cycle(sizes or [1]):
            if start >= len(chunks):
                break
            part = chunks[start : start + size]
            offsets = [10 + start + i for i in range(len(part))]
            if many:
                recorder.feed_many(Pieces.of(part), offsets)
            else:
                for chunk, offset in zip(part, offsets, strict=True):
                    recorder.feed(chunk, offset)
            start += size
        return recorder.finish(EndKind.CLEAN, 10_000)

    @settings(max_examples=300, deadline=None)
    @given(
        objects=st.lists(shaped | generated | tool_call, max_size=24),
        sizes=st.lists(st.integers(1, 8), max_size=4),
        shifts=st.lists(st.sampled_from([0, 0, 0, -2, -1, 1, 2]), max_size=24),
        route=st.sampled_from([Route.CHAT, Route.COMPLETIONS]),
        timing=st.booleans(),
        events=st.sampled_from([None, 5]),
    )
    def test_same_record(self, objects, sizes, shifts, route, timing, events) -> None:
        chunks = [b"data: " + json.dumps(o).encode() + b"\n\n" for o in objects]
        if any(shifts):  # chunk boundaries moved off the event boundaries
            body = b"".join(chunks)
            bounds = list(itertools.accumulate(map(len, chunks)))
            moved = (shifts + [0] * len(bounds))[: len(bounds)]
            cuts = [max(0, min(len(body), b + d)) for b, d in zip(bounds, moved, strict=True)]
            cuts = sorted({0, *cuts, len(body)})
            chunks = [body[a:b] for a, b in itertools.pairwise(cuts)]
        caps = {**self.CAPS, "max_events": events}
        assert self.observed(chunks, sizes, route, True, timing, **caps) == self.observed(
            chunks, sizes, route, False, timing, **caps
        )

    def test_batch_is_taken(self) -> None:
        """Dynamo's chunks take the batch path (a guard against a check that always
        declines: the property above would still hold)."""
        chunks = [sse(chat(word), done=False) for word in ("Hel", "lo", " there")]
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False)
        recorder.head(200, SSE, "", 1)
        recorder.feed(b": keep-alive\n\n", 2)
        assert recorder._batch(Pieces.of(chunks), [3, 4, 5])
        observed = recorder.finish(EndKind.CLEAN, 10)
        assert observed.choices[0].text == "Hello there"
        assert (observed.first_token_offset_ns, observed.last_token_offset_ns) == (3, 5)
        assert observed.events == 3

    def test_batch_is_taken_off_the_event_boundaries(self) -> None:
        """As a proxy's reads cut a stream: events split between chunks, several in
        one, the blank line itself split; each event at the offset of the chunk
        its blank line ended in."""
        body = b"".join(sse(chat(word), done=False) for word in ("Hel", "lo", " there", "!"))
        first, second = body.index(b"\n\n") + 1, body.index(b"there")
        chunks = [body[:first], body[first:second], body[second:-5], body[-5:]]
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=True)
        recorder.head(200, SSE, "", 1)
        recorder.feed(b": keep-alive\n\n", 2)
        assert recorder._batch(Pieces.of(chunks[:2]), [3, 4])
        assert recorder._batch(Pieces.of(chunks[2:]), [5, 6])
        observed = recorder.finish(EndKind.CLEAN, 10)
        assert observed.choices[0].text == "Hello there!"
        assert list(observed.chunk_offsets_ns) == [4, 4, 5, 6]
        assert observed.events == 4
