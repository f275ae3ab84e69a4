"""A Responses body -> the chat request vLLM 0.32 renders (the expected messages
are what vLLM's own construct_input_messages returned for the same bodies)."""

from __future__ import annotations

import pytest

from shadow_proxy.worker.request.fields import Reject
from shadow_proxy.worker.request.vllm_responses import chat_request, messages

CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
TOOL_CALL = {"id": "c1", "function": {"name": "f", "arguments": "{}"}, "type": "function"}


class TestMessages:
    """vLLM's grouping of items into chat messages."""

    def test_instructions_and_text(self) -> None:
        assert messages("be nice", "hi") == [
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": "hi"},
        ]

    def test_call_without_assistant_opens_one(self) -> None:
        items = [
            {"role": "user", "content": "w?"},
            CALL,
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]
        assert messages(None, items) == [
            {"role": "user", "content": "w?"},
            {"role": "assistant", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ]

    def test_calls_join_the_assistant_before(self) -> None:
        items = [{"role": "assistant", "content": "checking"}, CALL, {**CALL, "call_id": "c2"}]
        (turn,) = messages(None, items)
        assert turn["content"] == "checking"
        assert [c["id"] for c in turn["tool_calls"]] == ["c1", "c2"]

    def test_reasoning_then_answer_is_one_turn(self) -> None:
        reasoning = {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "sum"}],
            "content": [{"type": "reasoning_text", "text": "think"}],
        }
        answer = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "a"}],
        }
        assert messages(None, [reasoning, answer]) == [
            {"role": "assistant", "reasoning": "think", "content": "a"}
        ]

    def test_system_items_stay_apart(self) -> None:
        items = [{"role": "system", "content": "s1"}, {"role": "user", "content": "u"}]
        assert messages("inst", items)[:2] == [
            {"role": "system", "content": "inst"},
            {"role": "system", "content": "s1"},
        ]

    def test_unknown_item_rejected(self) -> None:
        with pytest.raises(Reject, match="invalid_field"):
            messages(None, [{"type": "web_search_call"}])


class TestRequest:
    """Tools, continuation and options."""

    def test_tools_and_options(self) -> None:
        chat = chat_request(
            {
                "model": "m",
                "input": "x",
                "tools": [
                    {"type": "function", "name": "f", "parameters": {}},
                    {"type": "web_search"},
                ],
                "tool_choice": "none",
                "max_output_tokens": 4,
                "reasoning": {"effort": "low"},
            }
        )
        assert chat["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        assert (chat["max_tokens"], chat["reasoning_effort"]) == (4, "low")
        assert (chat["add_generation_prompt"], chat["continue_final_message"]) == (True, False)

    def test_in_progress_message_continues(self) -> None:
        last = {
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [{"type": "output_text", "text": "one,"}],
        }
        chat = chat_request({"model": "m", "input": [{"role": "user", "content": "Count"}, last]})
        assert (chat["add_generation_prompt"], chat["continue_final_message"]) == (False, True)

    @pytest.mark.parametrize(
        ("field", "reason"),
        [("previous_response_id", "previous_response"), ("prompt", "stored_prompt")],
    )
    def test_state_of_the_frontend(self, field: str, reason: str) -> None:
        with pytest.raises(Reject, match=reason):
            chat_request({"model": "m", "input": "x", field: "id"})
