"""One chat or completions object read per choice: what it adds to the table and
what it says of the response."""

from __future__ import annotations

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.chat_object import MAX_ID_CHARS, read_object
from shadow_proxy.worker.response.choices import ChoiceTable


def table() -> ChoiceTable:
    return ChoiceTable(
        max_text_bytes_per_choice=1 << 20,
        max_text_bytes_total=1 << 20,
        max_token_ids_per_choice=1 << 10,
        max_token_ids_total=1 << 10,
        max_choices=8,
    )


class TestChat:
    """A streamed chat chunk: delta text, reasoning and tool calls count as output."""

    def test_delta_parts(self) -> None:
        choices = table()
        obj = {
            "id": "chatcmpl-1",
            "choices": [
                {"index": 0, "delta": {"content": "a", "reasoning_content": "r"}},
                {
                    "index": 1,
                    "delta": {"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
                    "finish_reason": "tool_calls",
                },
            ],
        }
        error, rid, usage, carried, malformed = read_object(obj, Route.CHAT, choices, stream=True)
        assert (error, rid, usage, carried, malformed) == (None, "chatcmpl-1", None, True, 0)
        assert choices.finish_reasons() == [(0, None), (1, "tool_calls")]

    def test_no_output(self) -> None:
        obj = {"id": "x" * 1000, "usage": {"prompt_tokens": 3}, "choices": [{"delta": {}}]}
        _, rid, usage, carried, _ = read_object(obj, Route.CHAT, table(), stream=True)
        assert (len(rid), usage, carried) == (MAX_ID_CHARS, {"prompt_tokens": 3}, False)

    def test_error_only_in_a_stream(self) -> None:
        obj = {"error": {"message": "boom"}}
        assert read_object(obj, Route.CHAT, table(), stream=True)[0] == "boom"
        assert read_object(obj, Route.CHAT, table(), stream=False)[0] is None


class TestCompletions:
    """Completions text and upstream token ids; a malformed id list is counted."""

    def test_text_and_ids(self) -> None:
        obj = {"choices": [{"index": 0, "text": "hi", "token_ids": [1, 2]}]}
        *_, carried, malformed = read_object(obj, Route.COMPLETIONS, table(), stream=True)
        assert (carried, malformed) == (True, 0)

    def test_malformed_ids(self) -> None:
        obj = {"choices": [{"index": 0, "token_ids": ["x"]}]}
        *_, carried, malformed = read_object(obj, Route.COMPLETIONS, table(), stream=True)
        assert (carried, malformed) == (False, 1)
