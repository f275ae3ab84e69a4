"""The typed-struct fast path reads a chunk exactly as the general parser does, or
leaves it to it: for every chunk, generated or captured from Dynamo."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.chat_object import read_object
from shadow_proxy.worker.response.choices import ChoiceTable
from shadow_proxy.worker.response.fast_chunk import read_chunk
from tests.support import ROOT

CAPTURES = ROOT / "tests" / "data" / "dynamo"


def table() -> ChoiceTable:
    return ChoiceTable(
        max_text_bytes_per_choice=64,
        max_text_bytes_total=96,
        max_token_ids_per_choice=8,
        max_token_ids_total=12,
        max_choices=3,
    )


def state(choices: ChoiceTable) -> Any:
    return (choices.observed(), choices.ignored, choices.text_total, choices.ids_total)


def general(data: bytes, route: Route, choices: ChoiceTable) -> tuple[Any, ...] | None:
    """What the general path makes of ``data`` (None: it is malformed there)."""
    try:
        obj = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    return read_object(obj, route, choices, stream=True)


def same_as_general(data: bytes, route: Route) -> bool:
    """Asserts the fast path agrees with the general one, on the bytes and on the
    text the SSE parser gives (invalid UTF-8 as U+FFFD); True when it took them."""
    text = data.decode("utf-8", "replace")
    taken = one_same_as_general(data, data, route)
    from_text = one_same_as_general(text, data, route)
    if data == text.encode():  # valid UTF-8: the same decision on the text
        assert from_text == taken
    return taken


def one_same_as_general(given: bytes | str, data: bytes, route: Route) -> bool:
    fast_table, slow_table = table(), table()
    for _ in range(2):  # twice: the second chunk meets the state the first left
        fast = read_chunk(given, route, fast_table)
        if fast is None:
            assert state(fast_table) == state(table()), "a chunk left to the general path"
            return False
        slow = general(data, route, slow_table)
        assert slow is not None
        error, upstream_id, usage, carried, malformed = slow
        assert (error, usage) == (None, None)
        assert fast == (upstream_id, carried, malformed)
        assert state(fast_table) == state(slow_table)
    return True


# A few short values often (so that fields collide: reasoning equal to
# reasoning_content), any text sometimes.
texts = st.sampled_from(["", "a", "é", "😀"]) | st.text(max_size=12)
anything = st.one_of(
    st.none(), st.booleans(), st.integers(), texts, st.lists(st.integers(), max_size=2)
)
indices = st.one_of(st.integers(-2, 4), st.none(), st.booleans(), st.just(1.0), texts)
ids = st.lists(st.integers(-(2**70), 2**70) | st.integers(0, 200), max_size=10)
deltas = st.dictionaries(
    st.sampled_from(
        ["role", "content", "reasoning_content", "reasoning", "refusal", "tool_calls", "x"]
    ),
    st.one_of(texts, st.none(), st.just([{"type": "text", "text": "part"}]), st.just([])),
    max_size=4,
)
choices = st.fixed_dictionaries(
    {},
    optional={
        "index": indices,
        "delta": st.one_of(deltas, st.none(), texts),
        "text": st.one_of(texts, st.none(), st.integers()),
        "finish_reason": st.one_of(st.sampled_from(["stop", "length"]), st.none(), st.integers()),
        "token_ids": st.one_of(ids, st.none(), st.just([1.5]), st.just([True])),
        "logprobs": st.one_of(st.none(), anything),
        "stop_reason": anything,
        "message": st.just({"content": "unary"}),
    },
)
chunks = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(texts, st.none(), st.integers()),
        "choices": st.one_of(st.lists(choices | anything, max_size=3), anything),
        "object": st.sampled_from(["chat.completion.chunk", "text_completion", "error", None]),
        "usage": st.one_of(st.none(), st.just({"prompt_tokens": 3, "completion_tokens": 2})),
        "created": st.integers(0, 2**40),
        "model": texts,
        "system_fingerprint": st.none(),
        "error": st.one_of(texts, st.just({"message": "boom"})),
        "nvext": st.just({"token_ids": [1, 2]}),
        "other": anything,
    },
)

#: Chunks as Dynamo and vLLM send them, with the variations the fast path reads.
shaped_deltas = st.dictionaries(
    st.sampled_from(["role", "content", "reasoning_content", "reasoning", "refusal"]),
    st.one_of(texts, st.none()),
    max_size=4,
)
shaped = st.fixed_dictionaries(
    {
        "id": texts,
        "choices": st.lists(
            st.fixed_dictionaries(
                {"index": st.integers(0, 4)},
                optional={
                    "delta": shaped_deltas,
                    "text": texts,
                    "finish_reason": st.one_of(st.sampled_from(["stop", "length"]), st.none()),
                    "token_ids": ids,
                    "logprobs": st.none(),
                },
            ),
            max_size=3,
        ),
    },
    optional={"object": st.just("chat.completion.chunk"), "usage": st.none()},
)


class TestSameAsGeneral:
    @settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
    @given(
        chunk=chunks, route=st.sampled_from([Route.CHAT, Route.COMPLETIONS]), ascii=st.booleans()
    )
    def test_generated_chunks(self, chunk: dict[str, Any], route: Route, ascii: bool) -> None:
        same_as_general(json.dumps(chunk, ensure_ascii=ascii).encode(), route)

    @settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
    @given(chunk=shaped, route=st.sampled_from([Route.CHAT, Route.COMPLETIONS]))
    def test_shaped_chunks(self, chunk: dict[str, Any], route: Route) -> None:
        assert same_as_general(json.dumps(chunk).encode(), route)

    def test_reasoning_under_both_names_counts_once(self) -> None:
        data = b'{"choices":[{"index":0,"delta":{"reasoning_content":"r","reasoning":"r"}}]}'
        assert same_as_general(data, Route.CHAT)

    @pytest.mark.parametrize(
        "name",
        ["chat_stream_usage.sse", "chat_stream_mocker_killed.sse", "completions_stream_usage.sse"],
    )
    def test_dynamo_captures(self, name: str) -> None:
        """Every captured chunk but the usage one takes the fast path, and agrees."""
        route = Route.COMPLETIONS if name.startswith("completions") else Route.CHAT
        datas = [
            line.removeprefix(b"data: ")
            for line in (CAPTURES / name).read_bytes().split(b"\n")
            if line.startswith(b"data: {")
        ]
        taken = [same_as_general(data, route) for data in datas]
        usage = [b'"usage":{' in data or b'"error"' in data for data in datas]
        assert taken == [not u for u in usage]


class TestLeftToTheGeneralPath:
    """What the structs do not describe, or msgspec reads otherwise, is not taken."""

    @pytest.mark.parametrize(
        "data",
        [
            b'{"choices":[],"usage":{"prompt_tokens":1}}',
            b'{"object":"error","message":"boom"}',
            b'{"error":{"message":"boom"}}',
            b'{"choices":[{"index":0,"delta":{"tool_calls":[]}}]}',
            b'{"choices":[{"index":0,"delta":{"function_call":{"name":"f"}}}]}',
            b'{"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"a"}]}}]}',
            b'{"choices":[{"index":0,"delta":{"content":"\\ud800"}}]}',  # lone surrogate
            b'{"choices":[{"index":0,"delta":{"content":"\xff"}}]}',  # not UTF-8
            b'{"choices":[{"index":0,"token_ids":[NaN]}]}',
            b'{"choices":[{"index":true}]}',
            b'{"choices":[5]}',
            b'{"unknown":1}',
            b"[1]",
            b"",
        ],
    )
    def test_not_taken(self, data: bytes) -> None:
        assert read_chunk(data, Route.CHAT, table()) is None
        same_as_general(data, Route.CHAT)

    def test_integers_past_64_bits_are_exact(self) -> None:
        """The ids past the table's array type are malformed on both paths, not floats."""
        data = b'{"choices":[{"index":0,"token_ids":[1,36893488147419103232]}]}'
        assert read_chunk(data, Route.CHAT, table()) == (None, False, 1)
        assert same_as_general(data, Route.CHAT)
        assert same_as_general(b'{"choices":[{"index":0,"token_ids":[4294967295]}]}', Route.CHAT)

    def test_long_ids_and_reasons_are_cut_alike(self) -> None:
        long = "r" * 300
        data = json.dumps(
            {"id": long, "choices": [{"index": 0, "delta": {}, "finish_reason": long}]}
        ).encode()
        assert same_as_general(data, Route.CHAT)
