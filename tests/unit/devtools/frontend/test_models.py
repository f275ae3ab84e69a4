"""Prompt counts: the model's own template and tokenizer, cached and bounded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import openai
import pytest
from tokenizers import Tokenizer

from shadow_proxy.devtools.frontend import (
    PROMPT_CACHE_SIZE,
    ServedModel,
)
from tests.support import MODELS_DIR
from tests.support.frontend import HELLO, MODEL_NAMES, Server

CONVERSATIONS: dict[str, dict[str, Any]] = {
    "one-turn": {"messages": HELLO},
    "multi-turn": {
        "messages": [
            {"role": "system", "content": "You are terse. Ünïcödé ✨ 日本語"},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": [{"type": "text", "text": "Another, please."}]},
        ]
    },
    "tools": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 °C"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Current weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
    },
    "long": {"messages": [{"role": "user", "content": "lorem ipsum dolor sit amet " * 400}]},
    "template-kwargs": {
        "messages": HELLO,
        "chat_template_kwargs": {"enable_thinking": False},
    },
}


def hf_prompt_length(tokenizer: Any, case: Mapping[str, Any], *, file_encoder: bool = True) -> int:
    """The prompt length by transformers' own ``apply_chat_template``; with
    ``file_encoder`` the rendered text is encoded by tokenizer.json as written
    (what Dynamo and the proxy do) instead of transformers' backend."""
    kwargs = {
        "tools": case.get("tools"),
        "add_generation_prompt": True,
        **case.get("chat_template_kwargs", {}),
    }
    if file_encoder:
        text = tokenizer.apply_chat_template(case["messages"], tokenize=False, **kwargs)
        encoder = Tokenizer.from_file(str(Path(tokenizer.name_or_path) / "tokenizer.json"))
        return len(encoder.encode(text, add_special_tokens=False))
    ids = tokenizer.apply_chat_template(case["messages"], tokenize=True, **kwargs)
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    return len(ids)


class TestPromptTokens:
    """usage.prompt_tokens equals the model's own tokenizer and chat template."""

    @pytest.mark.parametrize("model", MODEL_NAMES)
    @pytest.mark.parametrize("case", sorted(CONVERSATIONS))
    async def test_chat_matches_hf(
        self, client: openai.AsyncOpenAI, hf_tokenizers: dict[str, Any], model: str, case: str
    ) -> None:
        spec = CONVERSATIONS[case]
        extra: dict[str, Any] = {}
        if "chat_template_kwargs" in spec:
            extra["extra_body"] = {"chat_template_kwargs": spec["chat_template_kwargs"]}
        if "tools" in spec:
            extra["tools"] = spec["tools"]
        reply = await client.chat.completions.create(
            model=model, messages=spec["messages"], max_tokens=1, **extra
        )
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == hf_prompt_length(hf_tokenizers[model], spec)
        # The model directories are built so that transformers' own backend agrees.
        transformers_count = hf_prompt_length(hf_tokenizers[model], spec, file_encoder=False)
        assert reply.usage.prompt_tokens == transformers_count

    async def test_template_kwargs_change_the_count(self, client: openai.AsyncOpenAI) -> None:
        plain = await client.chat.completions.create(model="chatml", messages=HELLO, max_tokens=1)
        thinking_off = await client.chat.completions.create(
            model="chatml",
            messages=HELLO,
            max_tokens=1,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert plain.usage is not None
        assert thinking_off.usage is not None
        assert thinking_off.usage.prompt_tokens > plain.usage.prompt_tokens

    @pytest.mark.parametrize("model", MODEL_NAMES)
    async def test_completion_string_prompt(
        self, client: openai.AsyncOpenAI, hf_tokenizers: dict[str, Any], model: str
    ) -> None:
        prompt = "<|im_start|>Special-looking text stays as it is. ünï ✨"
        reply = await client.completions.create(model=model, prompt=prompt, max_tokens=1)
        encoder = Tokenizer.from_file(str(MODELS_DIR / model / "tokenizer.json"))
        expected = len(encoder.encode(prompt, add_special_tokens=False))
        assert expected == len(hf_tokenizers[model].encode(prompt, add_special_tokens=False))
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == expected


class TestPromptCache:
    """Counts are cached per text, bounded, and agree with or without the pool."""

    async def test_inline_encoding(
        self, start: Callable[..., Awaitable[Server]], hf_tokenizers: dict[str, Any]
    ) -> None:
        url, _ = await start(tokenizer_threads=0)
        # A text no other test sends: the models (and their caches) are shared.
        case = {"messages": [{"role": "user", "content": "encoded inline " * 50}]}
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as c:
            reply = await c.chat.completions.create(model="deepseek", **case)
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == hf_prompt_length(hf_tokenizers["deepseek"], case)

    def test_bounded(self, served: dict[str, ServedModel]) -> None:
        model = ServedModel("t", served["chatml"].tokenizer, None, {}, None)
        for i in range(PROMPT_CACHE_SIZE + 1):
            model.remember_count(str(i), i)
        assert model.cached_count("0") is None
        assert model.cached_count("1") == 1
        assert model.cached_count(str(PROMPT_CACHE_SIZE)) == PROMPT_CACHE_SIZE
        assert len(model._counts) == PROMPT_CACHE_SIZE

    def test_none_fields_render_like_missing_ones(
        self, served: dict[str, ServedModel], hf_tokenizers: dict[str, Any]
    ) -> None:
        template = "{{ messages[0].content }}|{{ messages[0].name }}"
        model = ServedModel("t", served["chatml"].tokenizer, template, {}, None)
        messages = [{"role": "user", "content": "hi", "name": None}]
        expected = hf_tokenizers["chatml"].apply_chat_template(
            messages, chat_template=template, tokenize=False
        )
        assert model.chat_prompt_text({"messages": messages}) == expected == "hi|"
