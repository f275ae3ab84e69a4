"""The stream's repeated event read from its bytes gives the record the structs give:
for any texts (escapes, quotes, control bytes, invalid UTF-8, lone surrogates,
bodies that would close a neighbour's string), any other events between them,
any chunking and batching."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shadow_proxy.channel.handoff import Pieces
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.event_template import EventTemplate
from shadow_proxy.worker.response.fast_chunk import decode_batch
from shadow_proxy.worker.response.recorder import ResponseRecorder
from tests.support.responses import SSE
from tests.unit.worker.response import test_recorder

#: Dynamo 1.6.1's chat chunk around its content string, and vLLM's completions
#: chunk around its text (as each frontend writes them).
DYNAMO = (
    b'{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":',
    b'},"finish_reason":null,"logprobs":null}],"created":17,"model":"m",'
    b'"object":"chat.completion.chunk"}',
)
VLLM_COMPLETIONS = (
    b'{"id":"cmpl-2","object":"text_completion","created":17,"model":"m",'
    b'"choices":[{"index":0,"text":',
    b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}',
)

#: String literals that are not JSON the structs read: each must stop the template.
BAD_LITERALS = [
    b'"a\\"',  # a trailing backslash: the string does not end
    b'"a"b"',  # a bare quote
    b'"\x01"',  # a raw control byte
    b'"a\nb"',  # a raw line end (the event is two lines)
    b'"\xff"',  # invalid UTF-8
    b'"\\ud800"',  # a lone surrogate
    b'"\\x"',  # an unknown escape
    b'"\\u12"',  # a short \u escape
    b'"x\\"',  # with the next one, a body that ends in a backslash and one that
    b'","q"',  # opens a string after a comma: as one array, two strings again
    b'"',  # a literal that is one quote
    b"1",  # not a string
]
texts = st.sampled_from(["", "a", "é", "😀", '"', "\\", "\n", "\u0001", "日本"]) | st.text()


@st.composite
def literal(draw: Any) -> bytes:
    if draw(st.integers(0, 4)) == 0:
        return draw(st.sampled_from(BAD_LITERALS))
    text = draw(texts)
    return json.dumps(text, ensure_ascii=draw(st.booleans())).encode()


def other_event(route: Route) -> Any:
    """Events of another shape (a role, the finish, usage, another id, reasoning)."""
    finish = {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    role = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "R"}}],
    }
    reasoning = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": {"reasoning_content": "think"}}],
    }
    usage = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}}
    other_id = {"id": "chatcmpl-9", "choices": [{"index": 0, "delta": {"content": "O"}}]}
    second = {"id": "chatcmpl-1", "choices": [{"index": 1, "delta": {"content": "S"}}]}
    text = {"id": "cmpl-2", "choices": [{"index": 0, "text": "T", "finish_reason": None}]}
    shapes = [finish, role, reasoning, usage, other_id, second, text]
    return st.sampled_from([json.dumps(s).encode() for s in shapes] + [b"[DONE]"])


@st.composite
def stream(draw: Any, route: Route) -> list[bytes]:
    prefix, suffix = VLLM_COMPLETIONS if route is Route.COMPLETIONS else DYNAMO
    events = []
    for _ in range(draw(st.integers(1, 40))):
        if draw(st.integers(0, 6)) == 0:
            value = draw(other_event(route))
        else:
            value = prefix + draw(literal()) + suffix
        events.append(b"data: " + value + b"\n\n")
    return events


def chunked(events: list[bytes], cuts: list[int]) -> list[bytes]:
    body = b"".join(events)
    bounds = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


class TestSameRecord:
    """``feed_many`` (the template, the structs, one by one) gives the record ``feed``
    of each chunk gives."""

    @settings(max_examples=400, deadline=None)
    @given(
        data=st.data(),
        route=st.sampled_from([Route.CHAT, Route.COMPLETIONS]),
        cuts=st.lists(st.integers(0, 10**6), max_size=30),
        at_events=st.booleans(),
        sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
        timing=st.booleans(),
        small=st.booleans(),
    )
    def test_any_stream(self, data, route, cuts, at_events, sizes, timing, small) -> None:
        events = data.draw(stream(route))
        chunks = list(events) if at_events else chunked(events, cuts)
        caps: dict[str, Any] = {}
        if small:
            caps.update(max_text_bytes_per_choice=30, max_chunk_offsets=5, max_events=20)
        # feed_many of each batch, or feed of each chunk (as the recorder's own batch test)
        observed = test_recorder.TestBatch.observed
        assert observed(chunks, sizes, route, True, timing, **caps) == observed(
            chunks, sizes, route, False, timing, **caps
        )


def events_of(*literals: bytes) -> tuple[bytes, list[bytes]]:
    prefix, suffix = DYNAMO
    events = [b"data: " + prefix + lit + suffix for lit in literals]
    return b"".join(e + b"\n\n" for e in events), events


def template() -> EventTemplate:
    value = DYNAMO[0] + b'"ab"' + DYNAMO[1]
    (chunk,) = decode_batch(b"[" + value + b"]") or []
    learned = EventTemplate.learn(value, chunk, Route.CHAT)
    assert learned is not None
    return learned


class TestStops:
    """The template stops at the first string the structs would not read as it."""

    def test_each_bad_literal(self) -> None:
        for bad in BAD_LITERALS:
            text, events = events_of(b'"ok"', bad, b'"ok"')
            read = template().read(text, events, 0, len(text))
            # the first alone, or none (the structs read them all then)
            assert read is None or (read.count, read.text) == (1, b"ok"), bad

    def test_a_backslash_that_would_escape_the_next_quote(self) -> None:
        text, events = events_of(b'"ok"', b'"x\\"', b'","q"')
        read = template().read(text, events, 0, len(text))
        assert read is None or read.count == 1
        text, events = events_of(b'"x\\"', b'","q"')
        assert template().read(text, events, 0, len(text)) is None

    def test_escapes_and_empty_strings(self) -> None:
        text, events = events_of(b'"a\\nb"', b'""', b'"\\u00e9\\""', b'"\xc3\xa9"')
        read = template().read(text, events, 0, len(text))
        assert read is not None
        assert (read.count, read.text.decode(), read.carried) == (4, 'a\nbé"é', [0, 2, 3])


class TestTaken:
    """Guards against a template that never reads (the property would still hold)."""

    def test_the_stream_is_read_by_its_template(self) -> None:
        prefix, suffix = DYNAMO
        events = [
            b"data: " + prefix + json.dumps(t).encode() + suffix + b"\n\n" for t in "abcdefgh"
        ]
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=False)
        recorder.head(200, SSE, "", 1)
        recorder.feed(b": keep-alive\n\n", 2)
        recorder.feed_many(Pieces.of(events[:5]), [3, 4, 5, 6, 7])
        content = recorder._content
        assert content.template is not None
        read = content.template.read(
            b"".join(events[5:]), [e[:-2] for e in events[5:]], 0, 3 * len(events[5])
        )
        assert read is not None and (read.count, read.text) == (3, b"fgh")
        recorder.feed_many(Pieces.of(events[5:]), [8, 9, 10])
        observed = recorder.finish(EndKind.CLEAN, 20)
        assert observed.choices[0].text == "abcdefgh"
        assert observed.choices[0].content_chunks == 8
        assert (observed.first_token_offset_ns, observed.last_token_offset_ns) == (3, 10)

    def test_learned_only_from_a_plain_text_chunk(self) -> None:
        prefix, suffix = DYNAMO
        value = prefix + b'"a\\nb"' + suffix  # an escape: where the string ends is not sure
        (chunk,) = decode_batch(b"[" + value + b"]") or []
        assert EventTemplate.learn(value, chunk, Route.CHAT) is None
        value = prefix + b'"ab"' + suffix
        (chunk,) = decode_batch(b"[" + value + b"]") or []
        template = EventTemplate.learn(value, chunk, Route.CHAT)
        assert template is not None
        assert template.head == b"data: " + prefix + b'"'
        assert template.tail == b'"' + suffix
        assert EventTemplate.learn(value, chunk, Route.COMPLETIONS) is None
