"""Responses API request -> the chat request Dynamo 1.6.1 preprocesses in its place.

Each expected chat body below was seen on the running 1.6.1 frontend: a
Responses request and the chat request written here give the engine the same
token ids (a Dynamo backend recording every preprocessed request, chatml and
deepseek models; ``tests/integration/test_dynamo_responses.py`` keeps the
count check in CI).
"""

from __future__ import annotations

import json

import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.worker.request.fields import NOT_MIRRORED_REASONS, NotMirrored, Reject
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.responses import chat_request
from shadow_proxy.worker.request.tokenizer import load_model

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TIME = {"type": "function", "name": "get_time"}
CHAT_WEATHER = {
    "type": "function",
    "function": {k: v for k, v in WEATHER.items() if k != "type"},
}
CHAT_TIME = {"type": "function", "function": {"name": "get_time"}}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def messages(body: dict) -> list[dict]:
    return chat_request({"model": "m", **body})["messages"]


def reason(body: dict) -> str:
    with pytest.raises(Reject) as raised:
        chat_request({"model": "m", **body})
    return raised.value.reason


class TestSystem:
    """instructions and leading system/developer items make one system message."""

    def test_string_input_is_one_user_message(self) -> None:
        assert messages({"input": "hello"}) == [user("hello")]

    def test_instructions_come_first(self) -> None:
        body = {"instructions": "Be terse.", "input": "hi"}
        assert messages(body) == [{"role": "system", "content": "Be terse."}, user("hi")]

    def test_empty_instructions_still_open_a_system_message(self) -> None:
        assert messages({"instructions": "", "input": "hi"})[0] == {
            "role": "system",
            "content": "",
        }

    def test_leading_items_merge_with_a_blank_line(self) -> None:
        body = {
            "instructions": "I",
            "input": [
                {"role": "system", "content": "S"},
                {"role": "developer", "content": "D"},
                user("hi"),
            ],
        }
        assert messages(body) == [{"role": "system", "content": "I\n\nS\n\nD"}, user("hi")]

    def test_system_parts_are_concatenated(self) -> None:
        parts = [{"type": "input_text", "text": "S1"}, {"type": "input_text", "text": "S2"}]
        body = {"input": [{"role": "system", "content": parts}, user("hi")]}
        assert messages(body)[0] == {"role": "system", "content": "S1S2"}

    def test_later_system_items_stay_apart(self) -> None:
        body = {
            "instructions": "I",
            "input": [user("hi"), {"role": "system", "content": "S"}, user("again")],
        }
        assert messages(body) == [
            {"role": "system", "content": "I"},
            user("hi"),
            {"role": "system", "content": "S"},
            user("again"),
        ]

    def test_item_references_are_dropped(self) -> None:
        body = {
            "instructions": "I",
            "input": [
                {"type": "item_reference", "id": "msg_1"},
                {"role": "system", "content": "S"},
                user("hi"),
            ],
        }
        assert messages(body) == [{"role": "system", "content": "I\n\nS"}, user("hi")]


class TestUser:
    """User content: strings as they are, text parts joined with newlines."""

    def test_typed_message_with_text_parts(self) -> None:
        parts = [{"type": "input_text", "text": "one "}, {"type": "input_text", "text": "two"}]
        body = {"input": [{"type": "message", "role": "user", "content": parts}]}
        assert messages(body) == [user("one \ntwo")]

    def test_images_become_chat_image_parts(self) -> None:
        parts = [
            {"type": "input_text", "text": "see"},
            {"type": "input_image", "image_url": "https://example.com/a.png"},
        ]
        assert messages({"input": [{"role": "user", "content": parts}]})[0]["content"] == [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ]

    @pytest.mark.parametrize(
        "part",
        [
            {"type": "input_file", "file_id": "f"},
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
            {"type": "input_image", "file_id": "f"},
        ],
    )
    def test_parts_the_frontend_refuses(self, part: dict) -> None:
        assert reason({"input": [{"role": "user", "content": [part]}]}) == "invalid_field"


class TestAssistantTurns:
    """Assistant messages, calls and reasoning in a row make one assistant message."""

    def test_consecutive_assistant_texts_concatenate(self) -> None:
        body = {
            "input": [
                user("q"),
                {"role": "assistant", "content": "a1"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "a2 "},
                        {"type": "refusal", "refusal": "no"},
                    ],
                },
                user("q2"),
            ]
        }
        assert messages(body) == [
            user("q"),
            {"role": "assistant", "content": "a1a2 no"},
            user("q2"),
        ]

    def test_function_call_round_trip(self) -> None:
        body = {
            "input": [
                user("weather?"),
                {"role": "assistant", "content": "checking"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "r1"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [
                        {"type": "input_text", "text": "o1"},
                        {"type": "input_text", "text": "o2"},
                    ],
                },
            ]
        }
        call = {"type": "function"}
        assert messages(body) == [
            user("weather?"),
            {
                "role": "assistant",
                "content": "checking",
                "tool_calls": [
                    {"id": "c1", **call, "function": {"name": "f", "arguments": '{"a":1}'}},
                    {"id": "c2", **call, "function": {"name": "g", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "tool", "tool_call_id": "c2", "content": "o1o2"},
        ]

    def test_calls_alone_have_no_content(self) -> None:
        body = {
            "input": [
                user("q"),
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"role": "assistant", "content": "after"},
                user("q2"),
            ]
        }
        assistant = messages(body)[1]
        assert assistant["content"] == "after"
        assert len(assistant["tool_calls"]) == 1
        body["input"][2] = user("q1")
        assert messages(body)[1]["content"] is None

    def test_reasoning_joins_the_turn(self) -> None:
        summary = [{"type": "summary_text", "text": "s1"}, {"type": "summary_text", "text": "s2"}]
        body = {
            "input": [
                user("q"),
                {"type": "reasoning", "id": "rs_1", "summary": summary},
                {"role": "assistant", "content": "a"},
                {
                    "type": "reasoning",
                    "id": "rs_2",
                    "summary": [{"type": "summary_text", "text": "ignored"}],
                    "content": [{"type": "reasoning_text", "text": "r2"}],
                },
                {"role": "assistant", "content": "b"},
                {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "x"},
                user("q2"),
            ]
        }
        assert messages(body)[1] == {
            "role": "assistant",
            "content": "ab",
            "reasoning_content": "s1s2r2",
        }

    def test_reasoning_alone_is_an_empty_turn(self) -> None:
        body = {
            "input": [
                user("q"),
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]},
                user("q2"),
            ]
        }
        assert messages(body)[1] == {"role": "assistant", "content": "", "reasoning_content": "t"}


class TestOptions:
    """Tools, tool choice, text format and sampling fields, mapped as 1.6.1 does."""

    def test_function_tools_become_chat_tools(self) -> None:
        chat = chat_request({"model": "m", "input": "q", "tools": [WEATHER, TIME]})
        assert chat["tools"] == [CHAT_WEATHER, CHAT_TIME]
        assert "tools" not in chat_request({"model": "m", "input": "q", "tools": []})

    def test_hosted_tools_are_refused(self) -> None:
        assert reason({"input": "q", "tools": [{"type": "web_search"}, WEATHER]}) == (
            "invalid_field"
        )

    def test_tool_choice_none_is_the_chat_rule(self) -> None:
        chat = chat_request({"model": "m", "input": "q", "tools": [WEATHER], "tool_choice": "none"})
        assert chat["tool_choice"] == "none"
        assert "guided_json" not in chat

    def test_required_forces_the_array_of_calls(self) -> None:
        body = {"model": "m", "input": "q", "tools": [WEATHER, TIME], "tool_choice": "required"}
        assert chat_request(body)["guided_json"] == {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "anyOf": [
                    {
                        "properties": {
                            "name": {"type": "string", "enum": [name]},
                            "parameters": parameters,
                        },
                        "required": ["name", "parameters"],
                    }
                    for name, parameters in (
                        ("get_weather", WEATHER["parameters"]),
                        ("get_time", {"type": "object", "properties": {}}),
                    )
                ],
            },
        }

    def test_named_function_forces_its_parameters(self) -> None:
        choice = {"type": "function", "name": "get_weather"}
        body = {"model": "m", "input": "q", "tools": [WEATHER, TIME], "tool_choice": choice}
        chat = chat_request(body)
        assert chat["guided_json"] == WEATHER["parameters"]
        assert chat["tools"] == [CHAT_WEATHER, CHAT_TIME]

    @pytest.mark.parametrize("mode", ["auto", "required"])
    def test_allowed_tools_narrow_the_prompt(self, mode: str) -> None:
        choice = {"type": "allowed_tools", "mode": mode, "tools": [TIME, WEATHER]}
        body = {"model": "m", "input": "q", "tools": [WEATHER, {"type": "function", "name": "x"}]}
        with pytest.raises(Reject):
            chat_request({**body, "tool_choice": choice})
        choice["tools"] = [{"type": "function", "name": "get_weather"}]
        chat = chat_request({**body, "tool_choice": choice})
        assert chat["tools"] == [CHAT_WEATHER]
        assert ("guided_json" in chat) is (mode == "required")

    @pytest.mark.parametrize(
        ("text", "schema"),
        [
            ({"format": {"type": "text"}}, None),
            ({"format": {"type": "json_object"}}, {"type": "object"}),
            (
                {"format": {"type": "json_schema", "name": "x", "schema": {"type": "integer"}}},
                {"type": "integer"},
            ),
        ],
    )
    def test_text_format(self, text: dict, schema: dict | None) -> None:
        chat = chat_request({"model": "m", "input": "q", "text": text})
        assert chat.get("guided_json") == schema

    def test_a_forced_tool_wins_over_the_text_format(self) -> None:
        body = {
            "model": "m",
            "input": "q",
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_object"}},
        }
        assert chat_request(body)["guided_json"] == WEATHER["parameters"]

    def test_mapped_and_ignored_fields(self) -> None:
        body = {
            "model": "m",
            "input": "q",
            "max_output_tokens": 7,
            "temperature": 0.2,
            "top_p": 0.9,
            "reasoning": {"effort": "none", "summary": "auto"},
            "nvext": {"annotations": ["request_id"]},
            # accepted by 1.6.1 and without effect on the engine's request:
            "stop": ["x"],
            "top_k": 3,
            "ignore_eos": True,
            "store": False,
            "metadata": {"k": "v"},
            "conversation": "conv_1",
            "background": True,
            "max_tool_calls": 2,
            "unknown_key": 1,
        }
        assert chat_request(body) == {
            "model": "m",
            "messages": [user("q")],
            "max_tokens": 7,
            "temperature": 0.2,
            "top_p": 0.9,
            "reasoning_effort": "none",
            "nvext": {"annotations": ["request_id"]},
        }


class TestRefused:
    """What the frontend refuses or keeps as state is not rebuilt, with a reason."""

    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            ({"input": "q", "previous_response_id": "resp_1"}, "previous_response"),
            ({"input": "q", "prompt": {"id": "pmpt_1"}}, "stored_prompt"),
            ({"input": []}, "missing_messages"),
            ({}, "missing_messages"),
            ({"input": 5}, "invalid_field"),
            ({"input": "q", "max_output_tokens": 0}, "invalid_field"),
            ({"input": "q", "tool_choice": "required"}, "invalid_field"),
            ({"input": "q", "tools": [WEATHER], "tool_choice": {"type": "x"}}, "invalid_field"),
            ({"input": [{"type": "mystery"}]}, "invalid_field"),
            ({"input": [{"role": "critic", "content": "x"}]}, "invalid_field"),
            ({"input": [{"type": "function_call", "name": "f"}]}, "invalid_field"),
            ({"input": "q", "text": {"format": {"type": "yaml"}}}, "invalid_field"),
        ],
    )
    def test_reasons(self, body: dict, expected: str) -> None:
        assert reason(body) == expected
        assert expected in NOT_MIRRORED_REASONS


@pytest.fixture(scope="module")
def preprocessor(model_dirs) -> Preprocessor:
    return Preprocessor({name: load_model(name, str(path)) for name, path in model_dirs.items()})


def preprocess(preprocessor: Preprocessor, route: Route, body: dict):
    return preprocessor.preprocess(route, json.dumps(body).encode(), 1_000_000)


class TestPreprocessHook:
    """A Responses request is preprocessed as its chat request."""

    @pytest.mark.parametrize("model", ["deepseek", "chatml"])
    def test_same_engine_request_as_the_chat_request(self, preprocessor, model: str) -> None:
        responses = {
            "model": model,
            "instructions": "Be terse.",
            "input": [user("hi"), {"role": "assistant", "content": "Hello"}, user("again")],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 5,
            "temperature": 0.5,
            "stop": ["never mapped"],
        }
        chat = {
            "model": model,
            "messages": [
                {"role": "system", "content": "Be terse."},
                user("hi"),
                {"role": "assistant", "content": "Hello"},
                user("again"),
            ],
            "tools": [CHAT_WEATHER],
            "guided_json": WEATHER["parameters"],
            "max_tokens": 5,
            "temperature": 0.5,
        }
        mirrored = preprocess(preprocessor, Route.RESPONSES, responses)
        assert mirrored == preprocess(preprocessor, Route.CHAT, chat)
        assert mirrored.stop_conditions["max_tokens"] == 5
        assert "stop" not in mirrored.stop_conditions
        assert mirrored.sampling_options["guided_decoding"] == {"json": WEATHER["parameters"]}

    def test_refusals_are_counted_reasons(self, preprocessor) -> None:
        body = {"model": "chatml", "input": "q", "previous_response_id": "resp_1"}
        assert preprocess(preprocessor, Route.RESPONSES, body) == NotMirrored("previous_response")
        body = {"model": "nope", "input": "q", "previous_response_id": "resp_1"}
        assert preprocess(preprocessor, Route.RESPONSES, body) == NotMirrored("unknown_model")
