"""Messages and tools as vLLM 0.32 hands them to a template (each case as the
running server rendered it, or as its code reads)."""

from __future__ import annotations

import pytest

from shadow_proxy.worker.request.fields import Reject
from shadow_proxy.worker.request.templates.vllm_messages import conversation, tool_dicts


def conv(messages: list, fmt: str = "string", **options) -> list:
    return conversation(
        messages, fmt, developer_role=options.pop("developer_role", True), **options
    )


class TestSystemText:
    """A leading billing-header line of system text is dropped, nothing else."""

    def test_header_line(self) -> None:
        system = {"role": "system", "content": "x-anthropic-billing-header: cch=1\nBe kind."}
        assert conv([system])[0]["content"] == "Be kind."

    def test_header_part(self) -> None:
        parts = [
            {"type": "text", "text": "x-anthropic-billing-header: a"},
            {"type": "text", "text": "b"},
        ]
        assert conv([{"role": "system", "content": parts}])[0]["content"] == "b"

    def test_only_system(self) -> None:
        user = {"role": "user", "content": "x-anthropic-billing-header: kept\nu"}
        assert conv([user])[0]["content"] == user["content"]


class TestRoles:
    """Developer becomes system for templates that never name it; systems merge."""

    def test_developer_merged(self) -> None:
        messages = [
            {"role": "system", "content": "s1"},
            {"role": "developer", "content": "d1", "tools": []},
            {"role": "user", "content": "u"},
        ]
        assert conv(messages, developer_role=False) == [
            {"role": "system", "content": "s1\n\nd1"},
            {"role": "user", "content": "u"},
        ]
        assert conv(messages)[1] == {"role": "developer", "content": "d1", "tools": []}

    def test_any_role(self) -> None:
        assert conv([{"role": "critic", "content": "c"}]) == [{"role": "critic", "content": "c"}]


class TestContent:
    """Null content, Responses-only parts in chat, tool results."""

    @pytest.mark.parametrize(("fmt", "want"), [("string", ""), ("openai", [])])
    def test_null(self, fmt: str, want) -> None:
        assert conv([{"role": "assistant", "content": None}], fmt)[0]["content"] == want

    def test_responses_parts_alone_in_chat_are_empty(self) -> None:
        parts = [{"type": "input_text", "text": "a"}]
        assert conv([{"role": "user", "content": parts}])[0]["content"] == ""
        assert conv([{"role": "user", "content": parts}], chat=False)[0]["content"] == "a"
        mixed = [*parts, {"type": "text", "text": "b"}]
        assert conv([{"role": "user", "content": mixed}])[0]["content"] == "a\nb"

    def test_tool_result_parts_joined_in_openai_format(self) -> None:
        parts = [{"type": "text", "text": "sun"}, {"type": "text", "text": "21 C"}]
        (tool,) = conv([{"role": "tool", "tool_call_id": "c", "content": parts}], "openai")
        assert tool == {"role": "tool", "content": "sun\n21 C", "tool_call_id": "c"}

    def test_unknown_part_rejected(self) -> None:
        with pytest.raises(Reject, match="invalid_field"):
            conv([{"role": "user", "content": [{"type": "hologram"}]}])


class TestTools:
    """vLLM's pydantic dump: description and parameters always, extras dropped."""

    def test_dump(self) -> None:
        tools = [
            {"type": "function", "function": {"name": "a", "x": 1}, "y": 2},
            {"type": "function", "function": {"name": "b", "description": "d", "strict": False}},
        ]
        assert tool_dicts(tools) == [
            {
                "type": "function",
                "function": {"name": "a", "description": None, "parameters": None},
            },
            {
                "type": "function",
                "function": {"name": "b", "description": "d", "parameters": None, "strict": False},
            },
        ]

    def test_bad_tools_rejected(self) -> None:
        for bad in ("x", [{"type": "function"}], [{"function": {"name": 1}}]):
            with pytest.raises(Reject, match="invalid_field"):
                tool_dicts(bad)
