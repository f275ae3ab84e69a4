"""Messages and tools as Dynamo 1.6.1's typed structs write them back, and the
per-template steps, called directly (their use per template: test_dynamo_render.py)."""

from __future__ import annotations

import pytest

from shadow_proxy.worker.request.fields import Reject
from shadow_proxy.worker.request.templates import dynamo_messages as dm


def text(*parts: str) -> list[dict]:
    return [{"type": "text", "text": p} for p in parts]


class TestStructMessage:
    """Keys in the struct's order, role first, unknown keys dropped."""

    @pytest.mark.parametrize(
        ("message", "want"),
        [
            (
                {"content": "s", "foo": 1, "role": "system", "name": "n"},
                {"role": "system", "content": "s", "name": "n"},
            ),
            (
                {"name": "t", "content": "r", "tool_call_id": "c", "role": "tool"},
                {"role": "tool", "content": "r", "tool_call_id": "c"},
            ),
            (
                {"role": "function", "name": "f", "content": None, "x": 1},
                {"role": "function", "content": None, "name": "f"},
            ),
            (
                {"reasoning": "r", "content": None, "role": "assistant", "refusal": "no"},
                {"role": "assistant", "reasoning_content": "r", "refusal": "no"},
            ),
            (
                {"role": "assistant", "function_call": {"name": "f", "arguments": "{}", "x": 1}},
                {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
            ),
        ],
    )
    def test_written_back(self, message: dict, want: dict) -> None:
        got = dm.struct_message(message)
        assert got == want and list(got) == list(want)

    def test_tool_calls(self) -> None:
        call = {"function": {"arguments": "", "name": "f", "x": 1}, "id": "c", "extra": 2}
        got = dm.struct_message({"role": "assistant", "tool_calls": [call]})
        assert got["tool_calls"] == [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}
        ]

    def test_content_parts_keep_their_struct_keys(self) -> None:
        content = [
            {"type": "text", "text": "a", "cache_control": {}},
            {"type": "image_url", "image_url": {"url": "u"}, "detail": "x"},
            {"type": "refusal", "refusal": "r"},
        ]
        assert dm.struct_message({"role": "user", "content": content})["content"] == [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "u"}},
            {"type": "refusal", "refusal": "r"},
        ]

    @pytest.mark.parametrize(
        "message",
        [
            "not a map",
            {"role": "robot", "content": "x"},
            {"role": "user", "content": None},
            {"role": "user", "content": 3},
            {"role": "user", "content": [{"type": "input_text", "text": "x"}]},
            {"role": "user", "content": [{"type": "text", "text": 1}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": "u"}]},
            {"role": "user", "content": "x", "name": 1},
            {"role": "user", "content": [{"type": "input_image", "input_image": {}}]},
            {"role": "tool", "content": "r"},
            {"role": "tool", "content": None, "tool_call_id": "c"},
            {"role": "function", "content": "r"},
            {"role": "assistant", "reasoning_content": ["a", 1]},
            {"role": "assistant", "tool_calls": {}},
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]},
            {"role": "assistant", "function_call": {"arguments": "{}"}},
        ],
    )
    def test_rejected(self, message: object) -> None:
        with pytest.raises(Reject, match="invalid_field"):
            dm.struct_message(message)

    @pytest.mark.parametrize("arguments", ["[1]", "3", "{bad", '"s"'])
    def test_arguments_must_be_an_object_string(self, arguments: str) -> None:
        call = {"id": "c", "function": {"name": "f", "arguments": arguments}}
        with pytest.raises(Reject):
            dm.struct_message({"role": "assistant", "tool_calls": [call]})


class TestStructTools:
    """Tools normalised: parameters completed, a missing description appended last."""

    def test_normalised(self) -> None:
        tools = [
            {"type": "function", "function": {"name": "a", "parameters": {}, "extra": 1}},
            {"function": {"name": "b", "description": "d", "strict": True}},
        ]
        got = dm.struct_tools(tools)
        assert got == [
            {
                "type": "function",
                "function": {
                    "name": "a",
                    "parameters": {"type": "object", "properties": {}},
                    "description": "",
                },
            },
            {"type": "function", "function": {"name": "b", "description": "d", "strict": True}},
        ]
        assert list(got[0]["function"]) == ["name", "parameters", "description"]

    def test_absent(self) -> None:
        assert dm.struct_tools(None) is None

    @pytest.mark.parametrize(
        "tools",
        [
            [],
            {},
            ["x"],
            [{"function": {"description": "no name"}}],
            [{"function": {"name": "a", "parameters": []}}],
            [{"function": {"name": "a", "strict": "yes"}}],
        ],
    )
    def test_rejected(self, tools: object) -> None:
        with pytest.raises(Reject):
            dm.struct_tools(tools)


class TestSteps:
    """The per-template steps, each on its own."""

    def test_fix_content_joins_text_and_places_media(self) -> None:
        messages = [
            {"role": "user", "content": text("a", "b")},
            {"role": "user", "content": [*text("x"), {"type": "image_url", "image_url": {}}]},
        ]
        dm.fix_content(messages, arrays=False, placeholder=None)
        assert messages[0]["content"] == "a\nb"
        assert messages[1]["content"] == [{"type": "text", "text": "x"}, {"type": "image"}]

    def test_fix_content_arrays_and_placeholders(self) -> None:
        as_arrays = [{"role": "user", "content": "s"}]
        dm.fix_content(as_arrays, arrays=True, placeholder=None)
        assert as_arrays[0]["content"] == text("s")
        flat = [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {}},
                    *text("a"),
                    {"type": "video_url", "video_url": {}},
                ],
            }
        ]
        dm.fix_content(flat, arrays=False, placeholder="<|image_{n}|>")
        assert flat[0]["content"] == "<|image_1|>a<|image_2|>"

    def test_parse_arguments(self) -> None:
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
        legacy = {"name": "g", "arguments": '{"b":2}'}
        messages = [{"role": "assistant", "tool_calls": [call], "function_call": legacy}]
        dm.parse_arguments(messages, tool_calls=False)
        assert call["function"]["arguments"] == '{"a":1}' and legacy["arguments"] == {"b": 2}
        dm.parse_arguments(messages, tool_calls=True)
        assert call["function"]["arguments"] == {"a": 1}

    def test_fold_reasoning_into_content(self) -> None:
        turn = {"role": "assistant", "reasoning_content": ["r1", "", "r2"], "name": "n"}
        dm.fold_reasoning([turn], template_reads_it=False, string_only=False)
        assert turn == {
            "role": "assistant",
            "content": "<think>r1</think><think>r2</think>",
            "name": "n",
        }
        assert list(turn) == ["role", "content", "name"]
        parts = {"role": "assistant", "content": text("a"), "reasoning_content": "r"}
        dm.fold_reasoning([parts], template_reads_it=False, string_only=False)
        assert parts["content"] == text("<think>r</think>", "a")

    def test_fold_reasoning_kept_when_read(self) -> None:
        turn = {"role": "assistant", "content": "a", "reasoning_content": ["x", "y"]}
        kept = dict(turn)
        dm.fold_reasoning([kept], template_reads_it=True, string_only=False)
        assert kept == turn
        joined = dict(turn)
        dm.fold_reasoning([joined], template_reads_it=True, string_only=True)
        assert joined["reasoning_content"] == "xy"
        empty = {"role": "assistant", "content": "a", "reasoning_content": ""}
        dm.fold_reasoning([empty], template_reads_it=False, string_only=False)
        assert empty == {"role": "assistant", "content": "a", "reasoning_content": ""}

    def test_normalize_system(self) -> None:
        def messages() -> list[dict]:
            return [
                {"role": "system", "content": "s0"},
                {"role": "user", "content": "u"},
                {"role": "system", "content": "s1"},
                {"role": "user", "content": text("p")},
            ]

        assert dm.normalize_system(messages(), demote=False, coalesce=False) == messages()
        demoted = dm.normalize_system(messages(), demote=True, coalesce=False)
        assert demoted == [
            {"role": "system", "content": "s0"},
            {"role": "user", "content": "u\n\ns1"},
            {"role": "user", "content": text("p")},
        ]
        merged = dm.normalize_system(messages(), demote=True, coalesce=True)
        assert merged[1:] == [{"role": "user", "content": "u\n\ns1\np"}]

    def test_continue_final_message(self) -> None:
        final = {"role": "assistant", "name": "n"}
        dm.mark_final_message([final])
        assert list(final) == ["role", "content", "name"]
        assert final["content"] == dm.CONTINUE_TAG
        parts = {"role": "assistant", "content": [{"type": "image"}]}
        dm.mark_final_message([parts])
        assert parts["content"][-1] == {"type": "text", "text": dm.CONTINUE_TAG}
        rendered = f"<a>partial{dm.CONTINUE_TAG}</a>GEN"
        assert dm.cut_at_tag(rendered) == "<a>partial"
        assert dm.cut_at_tag("no tag") == "no tag"
