"""The mock frontend, served on loopback with its production settings and read
with the real ``openai`` client (and aiohttp where bytes matter)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from tokenizers import Tokenizer

from shadow_proxy.devtools.frontend import (
    PROMPT_CACHE_SIZE,
    STATS_KEY,
    Faults,
    MockConfig,
    MockRequestError,
    ServedModel,
    build_parser,
    load_models,
    run_mock_frontend,
    serve_mock_frontend,
)
from shadow_proxy.devtools.modeldirs import build_all
from shadow_proxy.devtools.processes import wait_until

MODELS_ROOT = Path(__file__).resolve().parents[1] / ".models"
MODEL_NAMES = ("deepseek", "chatml")
HELLO = [{"role": "user", "content": "Hello there, how are you?"}]


@pytest.fixture(scope="module")
def model_dirs() -> dict[str, Path]:
    return {name: path for name, path in build_all(MODELS_ROOT).items() if name in MODEL_NAMES}


@pytest.fixture(scope="module")
def served(model_dirs: dict[str, Path]) -> dict[str, ServedModel]:
    return load_models(MockConfig(models=model_dirs))


@pytest.fixture(scope="module")
def hf_tokenizers(model_dirs: dict[str, Path]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(str(path)) for name, path in model_dirs.items()}


Server = tuple[str, web.Application]


@pytest.fixture
async def start(
    model_dirs: dict[str, Path], served: dict[str, ServedModel]
) -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    """Start a mock frontend with config overrides; stopped at teardown."""
    async with asyncio.timeout(60):
        stack: list[Any] = []

        async def _start(**overrides: Any) -> Server:
            config = MockConfig(models=model_dirs, **overrides)
            context = serve_mock_frontend(config, served)
            server = await context.__aenter__()
            stack.append(context)
            return server

        yield _start
        for context in reversed(stack):
            await context.__aexit__(None, None, None)


@pytest.fixture
async def server(start: Callable[..., Awaitable[Server]]) -> Server:
    return await start()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=10
    ) as c:
        yield c


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


def stats_of(server: Server) -> dict[str, int]:
    stats = server[1][STATS_KEY]
    return {
        "started": stats.requests_started,
        "completed": stats.requests_completed,
        "cancelled": stats.requests_cancelled,
        "failed": stats.requests_failed,
        "rejected": stats.requests_rejected,
        "tokens": stats.tokens_generated,
        "in_flight": stats.in_flight,
    }


def fault(text: str) -> dict[str, Any]:
    return {"extra_headers": {"x-mock-fault": text}}


async def sse_events(resp: aiohttp.ClientResponse) -> list[bytes]:
    """The ``data:`` payloads of an SSE body, in order."""
    body = await resp.read()
    return [e[len(b"data: ") :] for e in body.split(b"\n\n") if e]


class TestChat:
    """Chat completions look like an OpenAI frontend's, unary and streamed."""

    async def test_unary(self, client: openai.AsyncOpenAI) -> None:
        raw = await client.chat.completions.with_raw_response.create(
            model="deepseek", messages=HELLO, max_tokens=5, extra_headers={"x-request-id": "r-1"}
        )
        assert raw.headers["x-request-id"] == "r-1"
        reply = raw.parse()
        assert reply.id.startswith("chatcmpl-")
        assert reply.object == "chat.completion"
        assert len(reply.choices) == 1
        choice = reply.choices[0]
        assert choice.message.role == "assistant"
        assert choice.message.content == "The quick brown fox jumps"
        assert choice.finish_reason == "length"
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 5
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5

    async def test_stream_matches_unary(self, client: openai.AsyncOpenAI) -> None:
        unary = await client.chat.completions.create(model="chatml", messages=HELLO, max_tokens=7)
        stream = await client.chat.completions.create(
            model="chatml", messages=HELLO, max_tokens=7, stream=True
        )
        chunks = [chunk async for chunk in stream]
        assert len(chunks) == 7
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert len({c.id for c in chunks}) == 1
        assert chunks[0].id.startswith("chatcmpl-")
        assert chunks[0].choices[0].delta.role == "assistant"
        assert all(c.choices[0].delta.role is None for c in chunks[1:])
        assert [c.choices[0].finish_reason for c in chunks] == [None] * 6 + ["length"]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert text == unary.choices[0].message.content
        assert all(c.usage is None for c in chunks)

    async def test_default_max_tokens(self, start: Callable[..., Awaitable[Server]]) -> None:
        url, _ = await start(default_max_tokens=3)
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as c:
            reply = await c.chat.completions.create(model="deepseek", messages=HELLO)
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 3

    async def test_max_completion_tokens_wins(self, client: openai.AsyncOpenAI) -> None:
        reply = await client.chat.completions.create(
            model="deepseek", messages=HELLO, max_tokens=9, max_completion_tokens=2
        )
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 2

    async def test_n_choices_interleaved(self, client: openai.AsyncOpenAI) -> None:
        stream = await client.chat.completions.create(
            model="deepseek",
            messages=HELLO,
            max_tokens=3,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        indices = [c.choices[0].index for c in chunks if c.choices]
        assert indices == [0, 1, 0, 1, 0, 1]
        finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks[4:6]}
        assert finishes == {0: "length", 1: "length"}
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 6

    async def test_include_usage(self, client: openai.AsyncOpenAI) -> None:
        unary = await client.chat.completions.create(model="chatml", messages=HELLO, max_tokens=4)
        stream = await client.chat.completions.create(
            model="chatml",
            messages=HELLO,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        assert len(chunks) == 5
        assert chunks[-1].choices == []
        assert chunks[-1].usage == unary.usage

    async def test_sse_framing(self, server: Server, http: aiohttp.ClientSession) -> None:
        body = {"model": "deepseek", "messages": HELLO, "max_tokens": 2, "stream": True}
        async with http.post(server[0] + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream"
            events = await sse_events(resp)
        assert events[-1] == b"[DONE]"
        assert [json.loads(e)["choices"][0]["index"] for e in events[:-1]] == [0, 0]


class TestCompletions:
    """Text completions, unary and streamed, with string, token-id and batch prompts."""

    async def test_unary(self, client: openai.AsyncOpenAI) -> None:
        reply = await client.completions.create(model="deepseek", prompt="Once upon", max_tokens=4)
        assert reply.id.startswith("cmpl-")
        assert reply.object == "text_completion"
        assert reply.choices[0].text == "The quick brown fox"
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 4

    async def test_stream(self, client: openai.AsyncOpenAI) -> None:
        stream = await client.completions.create(
            model="deepseek",
            prompt="Once upon",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        assert all(c.object == "text_completion" for c in chunks)
        assert "".join(c.choices[0].text for c in chunks[:-1]) == "The quick brown fox"
        assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * 3 + ["length"]
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 4

    async def test_token_id_prompt_counts_as_is(self, client: openai.AsyncOpenAI) -> None:
        reply = await client.completions.create(model="chatml", prompt=[5, 6, 7], max_tokens=1)
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == 3

    async def test_batch_prompt(self, client: openai.AsyncOpenAI) -> None:
        reply = await client.completions.create(
            model="deepseek", prompt=[[1, 2], [3, 4, 5]], max_tokens=2, n=2
        )
        assert [c.index for c in reply.choices] == [0, 1, 2, 3]
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == 5
        assert reply.usage.completion_tokens == 8


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
        encoder = Tokenizer.from_file(str(MODELS_ROOT / model / "tokenizer.json"))
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


class TestRejections:
    """Invalid requests get OpenAI-style errors and generate nothing."""

    async def test_unknown_model(self, client: openai.AsyncOpenAI, server: Server) -> None:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="nope", messages=HELLO)
        assert caught.value.code == "model_not_found"
        assert caught.value.type == "invalid_request_error"
        assert stats_of(server)["rejected"] == 1
        assert stats_of(server)["tokens"] == 0

    async def test_invalid_json(self, server: Server, http: aiohttp.ClientSession) -> None:
        async with http.post(server[0] + "/v1/completions", data=b"{not json") as resp:
            assert resp.status == 400
            body = await resp.json()
        assert body["error"]["type"] == "invalid_request_error"

    async def test_unknown_fault_is_an_error(self, client: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.BadRequestError, match="unknown mock fault"):
            await client.chat.completions.create(
                model="deepseek", messages=HELLO, **fault("explode")
            )

    async def test_context_length(self, client: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.BadRequestError, match="maximum context length is 8192"):
            await client.completions.create(model="chatml", prompt=[1] * 8000, max_tokens=500)

    async def test_bad_max_tokens(self, client: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.BadRequestError, match="'max_tokens'"):
            await client.completions.create(model="chatml", prompt="x", max_tokens=0)


class TestFaults:
    """Each fault switch does what a test of the proxy needs it to do."""

    async def test_status(self, client: openai.AsyncOpenAI, server: Server) -> None:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="deepseek", messages=HELLO, stream=True, **fault("status=503")
            )
        assert caught.value.status_code == 503
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["code"] == 503
        assert stats_of(server)["failed"] == 1

    async def test_fault_in_body_field(self, client: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="deepseek", messages=HELLO, extra_body={"mock_fault": "status=429"}
            )
        assert caught.value.status_code == 429

    async def test_error_event(self, client: openai.AsyncOpenAI, server: Server) -> None:
        stream = await client.chat.completions.create(
            model="deepseek",
            messages=HELLO,
            max_tokens=10,
            stream=True,
            **fault("error-event-after=2"),
        )
        seen = []
        with pytest.raises(openai.APIError, match="worker died"):
            async for chunk in stream:
                seen.append(chunk)
        assert len(seen) == 2
        assert stats_of(server)["failed"] == 1

    async def test_error_event_bytes(self, server: Server, http: aiohttp.ClientSession) -> None:
        body = {"model": "chatml", "messages": HELLO, "max_tokens": 5, "stream": True, "n": 2}
        headers = {"x-mock-fault": "error-event-after=1"}
        async with http.post(
            server[0] + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            events = await sse_events(resp)
        assert len(events) == 3
        assert json.loads(events[-1]) == {
            "error": {"message": "worker died", "type": "internal_error", "code": 500}
        }

    async def test_error_unary(self, client: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.InternalServerError):
            await client.completions.create(
                model="deepseek", prompt="x", **fault("error-event-after=1")
            )

    async def test_drop(self, server: Server, http: aiohttp.ClientSession) -> None:
        body = {"model": "deepseek", "messages": HELLO, "max_tokens": 10, "stream": True}
        headers = {"x-mock-fault": "drop-after=3"}
        received = b""
        async with http.post(
            server[0] + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for data in resp.content.iter_any():
                    received += data
        assert received.count(b"data: ") == 3
        assert b"[DONE]" not in received
        assert stats_of(server)["failed"] == 1

    async def test_drop_openai(self, client: openai.AsyncOpenAI) -> None:
        stream = await client.completions.create(
            model="deepseek", prompt="x", max_tokens=10, stream=True, **fault("drop-after=2")
        )
        seen = []
        with pytest.raises(openai.APIConnectionError):
            async for chunk in stream:
                seen.append(chunk)
        assert len(seen) == 2

    async def test_hang(self, server: Server, http: aiohttp.ClientSession) -> None:
        body = {"model": "deepseek", "messages": HELLO, "stream": True}
        headers = {"x-mock-fault": "hang"}
        async with http.post(
            server[0] + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            assert resp.status == 200
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(resp.content.read(1), 0.3)
            assert stats_of(server)["in_flight"] == 1
        await wait_until(lambda: stats_of(server)["cancelled"] == 1)
        assert stats_of(server)["in_flight"] == 0
        assert stats_of(server)["tokens"] == 0

    async def test_hang_openai_timeout(self, server: Server) -> None:
        async with openai.AsyncOpenAI(
            base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=0.3
        ) as c:
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="deepseek", messages=HELLO, **fault("hang"))
        await wait_until(lambda: stats_of(server)["cancelled"] == 1)

    async def test_unfinished_choice(self, client: openai.AsyncOpenAI, server: Server) -> None:
        stream = await client.chat.completions.create(
            model="deepseek",
            messages=HELLO,
            max_tokens=3,
            n=2,
            stream=True,
            **fault("unfinished-choice=1"),
        )
        finishes: dict[int, list[str | None]] = {0: [], 1: []}
        async for chunk in stream:
            finishes[chunk.choices[0].index].append(chunk.choices[0].finish_reason)
        assert finishes == {0: [None, None, "length"], 1: [None, None, None]}
        assert stats_of(server)["completed"] == 1

    async def test_stop_after(self, client: openai.AsyncOpenAI) -> None:
        reply = await client.chat.completions.create(
            model="deepseek", messages=HELLO, max_tokens=10, n=2, **fault("stop-after=3")
        )
        assert [c.finish_reason for c in reply.choices] == ["stop", "stop"]
        assert reply.choices[0].message.content == "The quick brown"
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 6

    async def test_stop_after_beyond_max_tokens(self, client: openai.AsyncOpenAI) -> None:
        reply = await client.chat.completions.create(
            model="chatml", messages=HELLO, max_tokens=2, **fault("stop-after=5")
        )
        assert reply.choices[0].finish_reason == "length"


class TestCancellation:
    """A client that goes away stops the generation; the stats show it."""

    async def test_stream_disconnect_stops_generation(
        self, start: Callable[..., Awaitable[Server]], http: aiohttp.ClientSession
    ) -> None:
        server = await start(itl_ms=10)
        body = {"model": "deepseek", "messages": HELLO, "max_tokens": 1000, "stream": True}
        async with http.post(server[0] + "/v1/chat/completions", json=body) as resp:
            await resp.content.readuntil(b"\n\n")
            await resp.content.readuntil(b"\n\n")
            resp.close()
        await wait_until(lambda: stats_of(server)["cancelled"] == 1)
        tokens = stats_of(server)["tokens"]
        await asyncio.sleep(0.1)
        assert stats_of(server)["tokens"] == tokens
        assert tokens < 100
        assert stats_of(server)["in_flight"] == 0
        assert stats_of(server)["completed"] == 0

    async def test_unary_disconnect_stops_generation(
        self, start: Callable[..., Awaitable[Server]]
    ) -> None:
        server = await start(ttft_ms=10, itl_ms=10)
        async with openai.AsyncOpenAI(
            base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=0.2
        ) as c:
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="deepseek", messages=HELLO, max_tokens=500)
        await wait_until(lambda: stats_of(server)["cancelled"] == 1)
        assert stats_of(server)["tokens"] < 100

    async def test_ttft_and_itl(self, start: Callable[..., Awaitable[Server]]) -> None:
        server = await start(ttft_ms=150, itl_ms=30)
        async with openai.AsyncOpenAI(base_url=server[0] + "/v1", api_key="x") as c:
            began = time.monotonic()
            stream = await c.chat.completions.create(
                model="deepseek", messages=HELLO, max_tokens=5, stream=True
            )
            arrivals = [time.monotonic() - began async for _ in stream]
        assert arrivals[0] >= 0.14
        assert arrivals[-1] - arrivals[0] >= 4 * 0.03 - 0.01


class TestEndpoints:
    """Models, health and stats."""

    async def test_models(self, client: openai.AsyncOpenAI) -> None:
        models = [m.id async for m in client.models.list()]
        assert models == ["deepseek", "chatml"]

    async def test_health(self, server: Server, http: aiohttp.ClientSession) -> None:
        async with http.get(server[0] + "/health") as resp:
            assert resp.status == 200

    async def test_stats(
        self, client: openai.AsyncOpenAI, server: Server, http: aiohttp.ClientSession
    ) -> None:
        await client.chat.completions.create(model="deepseek", messages=HELLO, max_tokens=3, n=2)
        async with http.get(server[0] + "/mock/stats") as resp:
            stats = await resp.json()
        assert stats == {
            "requests_started": 1,
            "requests_completed": 1,
            "requests_cancelled": 0,
            "requests_failed": 0,
            "requests_rejected": 0,
            "tokens_generated": 6,
            "in_flight": 0,
        }


class TestFaultParsing:
    """The fault header parses strictly."""

    def test_combined(self) -> None:
        assert Faults.parse("hang, stop-after=2") == Faults(hang=True, stop_after=2)

    def test_empty(self) -> None:
        assert Faults.parse(None) == Faults()
        assert Faults.parse("") == Faults()

    @pytest.mark.parametrize(
        "text", ["status=200", "status=abc", "drop-after=-1", "hang=1", "drop-after", "nope"]
    )
    def test_invalid(self, text: str) -> None:
        with pytest.raises(MockRequestError):
            Faults.parse(text)


class TestConfigAndCli:
    """Configuration errors name the field; the CLI exits 2 on them."""

    def test_no_models(self) -> None:
        with pytest.raises(ValueError, match="'models'"):
            MockConfig(models={})

    def test_negative_itl(self, model_dirs: dict[str, Path]) -> None:
        with pytest.raises(ValueError, match=r"'itl_ms' must be at least 0 \(got -1\)"):
            MockConfig(models=model_dirs, itl_ms=-1)

    def test_parser(self) -> None:
        args = build_parser().parse_args(
            ["--model", "a=/x", "--model", "/y/b", "--itl-ms", "2", "--ttft-ms", "5"]
        )
        assert args.model == [("a", Path("/x")), ("b", Path("/y/b"))]
        assert (args.itl_ms, args.ttft_ms, args.default_max_tokens) == (2.0, 5.0, 16)

    def test_missing_tokenizer_exits_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert run_mock_frontend(["--model", f"m={tmp_path}"]) == 2
        assert "no tokenizer.json" in capsys.readouterr().err
