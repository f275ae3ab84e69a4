"""Helpers for the preprocessing tests: requests, Dynamo's message rewrites, expected ids."""

from __future__ import annotations

import json

from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.fields import NotMirrored
from shadow_proxy.worker.request.preprocess import Preprocessor

ARRIVAL_NS = 1_700_000_000_123_456_789


MODELS = ("deepseek", "chatml")


def run(pre: Preprocessor, route: Route, request: object) -> PreprocessedRequest | NotMirrored:
    return pre.preprocess(route, json.dumps(request).encode(), ARRIVAL_NS)


def vllm_messages(messages: list[dict]) -> list[dict]:
    """The message rewrites vLLM 0.32 makes before templating for these cases
    (both models' templates loop over content parts, so parts stay parts):
    tool-call arguments parsed from JSON."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


def expected_chat_ids(model, request: dict) -> list[int]:
    """Token ids worked out by the tokenizer's own apply_chat_template, on the
    messages as vLLM rewrites them (``tools`` kept with ``tool_choice: none``)."""
    tools = request.get("tools")
    out = model.tokenizer.apply_chat_template(
        vllm_messages(request["messages"]),
        tools=tools,
        tokenize=True,
        add_generation_prompt=True,
        **request.get("chat_template_kwargs", {}),
    )
    return list(out["input_ids"]) if not isinstance(out, list) else out


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


CHAT_CASES = {
    "single_turn": {"messages": [{"role": "user", "content": "Hello there"}]},
    "system_multi_turn": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ]
    },
    "tools": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [WEATHER_TOOL],
    },
    "tool_choice_none": {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "none",
    },
    "digits": {"messages": [{"role": "user", "content": "call 0123456789 or 42, x1y22"}]},
    "unicode_emoji": {"messages": [{"role": "user", "content": "héllo 日本語 😀🚀 — naïve café"}]},
    "empty_content": {"messages": [{"role": "user", "content": ""}]},
    "list_of_parts": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe "},
                    {"type": "text", "text": "this."},
                ],
            }
        ]
    },
    "thinking_off": {
        "messages": [{"role": "user", "content": "quick answer"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
}
