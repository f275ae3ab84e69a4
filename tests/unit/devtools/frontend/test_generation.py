"""What the built-in frontend generates: OpenAI-shaped chunks and bodies, and what it rejects."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from shadow_proxy.devtools.frontend import (
    MockConfig,
    diverges,
    generation,
    load_models,
    serve_mock_frontend,
)
from shadow_proxy.devtools.frontend.config import MockRequestError
from shadow_proxy.devtools.frontend.models import ServedModel
from tests.support.frontend import HELLO, Server, fault, sse_events, stats_of


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


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "deepseek", "messages": HELLO, **fields}).encode()


def read(
    raw: bytes, served: dict[str, ServedModel], fault_header: str | None = None, chat: bool = True
) -> generation.Request:
    return generation.read_request(
        raw, fault_header, chat=chat, models=served, default_max_tokens=16
    )


class TestReadRequest:
    """Validation, called directly: what a real frontend rejects, with its status."""

    def test_accepted(self, served: dict[str, ServedModel]) -> None:
        request = read(body(n=2, max_tokens=5, max_completion_tokens=3), served)
        assert (request.n, request.max_tokens, request.chat) == (2, 3, True)
        assert len(request.prompts) == 1 and isinstance(request.prompts[0], str)
        assert read(body(), served).max_tokens == 16  # the configured default

    @pytest.mark.parametrize(
        ("raw", "status", "message"),
        [
            (b"{nope", 400, "not valid JSON"),
            (b"[1]", 400, "must be a JSON object"),
            (json.dumps({"model": 5}).encode(), 400, "'model' must be a string"),
            (json.dumps({"model": "x"}).encode(), 404, "The model 'x' does not exist."),
            (None, 400, "'n' must be at most 128 (got 129)"),
            (json.dumps({"model": "deepseek", "messages": []}).encode(), 400, "'messages'"),
        ],
    )
    def test_rejected(self, served, raw: bytes | None, status: int, message: str) -> None:
        with pytest.raises(MockRequestError) as caught:
            read(raw if raw is not None else body(n=129), served)
        assert caught.value.status == status and message in str(caught.value)

    def test_the_fault_header_wins_over_the_body_field(self, served) -> None:
        request = read(body(mock_fault="status=500"), served, fault_header="stop-after=1")
        assert request.faults.stop_after == 1 and request.faults.status is None
        assert read(body(mock_fault="hang"), served).faults.hang


class TestPlan:
    """What to generate from the counted prompts."""

    def test_counts_and_usage(self, served) -> None:
        gen = generation.plan(read(body(n=2, max_tokens=4, stream=True), served), [11])
        assert (gen.choices, gen.tokens_per_choice, gen.finish_reason) == (2, 4, "length")
        assert gen.usage == {"prompt_tokens": 11, "completion_tokens": 8, "total_tokens": 19}
        assert gen.stream and not gen.include_usage
        assert gen.response_id.startswith("chatcmpl-")

    def test_usage_only_when_streaming_and_asked(self, served) -> None:
        asked = {"stream_options": {"include_usage": True}}
        assert generation.plan(read(body(stream=True, **asked), served), [1]).include_usage
        assert not generation.plan(read(body(**asked), served), [1]).include_usage

    def test_early_stop(self, served) -> None:
        gen = generation.plan(read(body(max_tokens=9), served, "stop-after=2"), [1])
        assert (gen.tokens_per_choice, gen.finish_reason) == (2, "stop")

    def test_context_length(self, served) -> None:
        model = served["chatml"]
        raw = json.dumps({"model": "chatml", "prompt": [1], "max_tokens": 100}).encode()
        request = read(raw, served, chat=False)
        with pytest.raises(MockRequestError, match=r"maximum context length is 8192"):
            generation.plan(request, [model.context_length])


class TestEncoding:
    """Each SSE event is valid JSON with the fields a client reads."""

    def test_chunks_and_unary_body(self, served) -> None:
        gen = generation.plan(read(body(n=2, max_tokens=2, stream=True), served), [3])
        encoder = generation.ChunkEncoder(gen)
        first = json.loads(encoder.token(1, 0, None).removeprefix(b"data: "))
        last = json.loads(encoder.token(0, 1, "length").removeprefix(b"data: "))
        assert first["id"] == gen.response_id and first["model"] == "deepseek"
        assert first["choices"][0]["index"] == 1
        assert first["choices"][0]["delta"]["role"] == "assistant"
        assert "role" not in last["choices"][0]["delta"]
        assert last["choices"][0]["finish_reason"] == "length"
        usage = json.loads(encoder.usage().removeprefix(b"data: "))
        assert usage["choices"] == [] and usage["usage"] == gen.usage
        unary = generation.unary_body(gen)
        assert [c["index"] for c in unary["choices"]] == [0, 1]
        assert unary["choices"][0]["message"]["content"] == served["deepseek"].output_text(2)


async def _texts(url: str, request_id: str, *, stream: bool, n: int = 1) -> list[str]:
    body = {"model": "deepseek", "prompt": [1, 2, 3], "max_tokens": 12, "n": n, "stream": stream}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/completions", json=body, headers={"x-request-id": request_id}
        ) as resp,
    ):
        assert resp.status == 200
        if not stream:
            return [c["text"] for c in (await resp.json())["choices"]]
        texts = [""] * n
        async for line in resp.content:
            data = line.strip().removeprefix(b"data: ")
            if data and data != b"[DONE]":
                for choice in json.loads(data)["choices"]:
                    texts[choice["index"]] += choice["text"]
        return texts


class TestDivergence:
    """Requests in the fraction skip one cycle token from ``diverge_at`` on; others do not."""

    async def test_selected_requests_diverge_at_the_position(
        self, model_dirs: dict[str, Path]
    ) -> None:
        config = MockConfig(
            models={"deepseek": model_dirs["deepseek"]}, diverge_fraction=0.5, diverge_at=4
        )
        models = load_models(config)
        plain = models["deepseek"].output_texts
        ids = [f"req-{k}" for k in range(40)]
        chosen = [i for i in ids if diverges(i, 0.5)]
        assert 5 < len(chosen) < 35  # the hash spreads ids over the fraction
        async with serve_mock_frontend(config, models) as (url, _app):
            for request_id in ids:
                for stream in (True, False):
                    texts = await _texts(url, request_id, stream=stream, n=2)
                    expected = list(plain[:12])
                    if request_id in chosen:
                        expected[4:] = plain[5:13]
                    assert texts == ["".join(expected)] * 2, (request_id, stream)

    async def test_off_by_default(self, model_dirs: dict[str, Path]) -> None:
        config = MockConfig(models={"deepseek": model_dirs["deepseek"]}, diverge_at=0)
        models = load_models(config)
        async with serve_mock_frontend(config, models) as (url, _app):
            texts = await _texts(url, "req-1", stream=True)
        assert texts == ["".join(models["deepseek"].output_texts[:12])]
