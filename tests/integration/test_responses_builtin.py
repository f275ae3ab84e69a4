"""The Responses API and batch completions through the proxy, in front of the
built-in frontend, read with the real ``openai`` client; records from real taps."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio

from shadow_proxy.devtools.frontend import MockConfig, load_models, serve_mock_frontend
from shadow_proxy.devtools.processes import WaitTimeout, reserve_port, wait_until
from tests.integration.responses_support import Collector
from tests.support.servers import proxy_config, run_proxy

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

MODEL = "deepseek"
JOINED, REQUESTS = "joined", "requests"


class Stack:
    def __init__(self, url: str, app, registry, records: Collector, client: openai.AsyncOpenAI):
        self.url, self.app, self.registry, self.records = url, app, registry, records
        self.client = client

    def metric(self, name: str, **labels: str) -> float:
        return sum(
            sample.value
            for family in self.registry.collect()
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    async def joined(self, request_id: str, prompt_index: int | None = None) -> dict:
        records = await self.records.wait(JOINED, [(request_id, prompt_index)])
        return records[request_id, prompt_index]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(model_dirs: dict[str, Path]) -> AsyncIterator[Stack]:
    config = MockConfig(models={MODEL: model_dirs[MODEL]}, itl_ms=2)
    ports = {JOINED: reserve_port(), REQUESTS: reserve_port()}
    taps = [
        {
            "name": REQUESTS,
            "topic": REQUESTS,
            "capture": "request",
            "endpoint": f"tcp://127.0.0.1:{ports[REQUESTS]}",
        },
        {
            "name": JOINED,
            "topic": JOINED,
            "capture": "request_response",
            "emit": "joined",
            "response": {"text": True},
            "endpoint": f"tcp://127.0.0.1:{ports[JOINED]}",
        },
    ]
    async with serve_mock_frontend(config, load_models(config)) as (frontend_url, app):
        proxy = proxy_config(
            frontend_url,
            models=[{"name": MODEL, "tokenizer": str(model_dirs[MODEL])}],
            taps=taps,
        )
        records = Collector([f"tcp://127.0.0.1:{p}" for p in ports.values()], list(ports))
        try:
            async with run_proxy(proxy) as (url, registry, _app):
                client = openai.AsyncOpenAI(
                    base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20
                )
                stack = Stack(url, app, registry, records, client)
                try:
                    await _subscribed(stack)
                    yield stack
                finally:
                    await client.close()
        finally:
            records.close()


async def _subscribed(stack: Stack) -> None:
    for _ in range(60):
        rid = new_id()
        await stack.client.responses.create(
            model=MODEL, input="probe", max_output_tokens=1, extra_headers={"x-request-id": rid}
        )
        try:
            await stack.records.wait(JOINED, [(rid, None)], timeout=1)
            await stack.records.wait(REQUESTS, [(rid, None)], timeout=1)
            return
        except WaitTimeout:
            continue
    pytest.fail("the taps' records never reached the SUB socket")


def new_id() -> str:
    return f"resp-test-{uuid.uuid4().hex}"


def headers(request_id: str) -> dict[str, Any]:
    return {"extra_headers": {"x-request-id": request_id}}


ITEMS: Any = [
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "7"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Another?"}]},
]


class TestOpenAIClient:
    """``client.responses.create``, unary and streaming: the record is what the client got."""

    @pytest.mark.parametrize("input_", ["Hello there, 世界 🙂", ITEMS], ids=["string", "items"])
    async def test_unary(self, stack: Stack, input_: Any) -> None:
        rid = new_id()
        reply = await stack.client.responses.create(
            model=MODEL,
            instructions="Be terse.",
            input=input_,
            max_output_tokens=6,
            temperature=0.5,
            **headers(rid),
        )
        assert reply.status == "incomplete"
        assert reply.incomplete_details.reason == "max_output_tokens"
        record = await stack.joined(rid)
        response = record["response"]
        assert record["origin"] == "responses"
        assert len(record["request"]["token_ids"]) == reply.usage.input_tokens
        assert record["request"]["stop_conditions"]["max_tokens"] == 6
        assert record["request"]["sampling_options"]["temperature"] == 0.5
        assert (response["outcome"], response["upstream_id"]) == ("complete", reply.id)
        [choice] = response["choices"]
        assert (choice["finish_reason"], choice["text"]) == ("length", reply.output_text)
        assert response["output_tokens"] == reply.usage.output_tokens == 6

    @pytest.mark.parametrize("choice", ["auto", "none"])
    async def test_tools(self, stack: Stack, choice: str) -> None:
        """Function tools in the prompt; ``tool_choice: none`` leaves them out."""
        rid = new_id()
        tool = {
            "type": "function",
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
        reply = await stack.client.responses.create(
            model=MODEL,
            input="Weather in Paris?",
            tools=[tool],
            tool_choice=choice,
            max_output_tokens=2,
            **headers(rid),
        )
        record = await stack.joined(rid)
        assert len(record["request"]["token_ids"]) == reply.usage.input_tokens
        without = await stack.client.responses.create(
            model=MODEL, input="Weather in Paris?", max_output_tokens=2
        )
        assert (reply.usage.input_tokens > without.usage.input_tokens) is (choice == "auto")

    async def test_streaming(self, stack: Stack) -> None:
        rid = new_id()
        stream = await stack.client.responses.create(
            model=MODEL, input=ITEMS, max_output_tokens=5, stream=True, **headers(rid)
        )
        deltas, final = [], None
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.incomplete":
                final = event.response
        assert final is not None
        record = await stack.joined(rid)
        response = record["response"]
        assert len(record["request"]["token_ids"]) == final.usage.input_tokens
        assert response["outcome"] == "complete"
        assert response["choices"][0]["text"] == "".join(deltas)
        assert response["output_tokens"] == final.usage.output_tokens == len(deltas) == 5
        assert response["upstream_id"] == final.id
        assert response["first_token_offset_ns"] < response["last_token_offset_ns"]

    async def test_completed_by_the_engine(self, stack: Stack) -> None:
        rid = new_id()
        reply = await stack.client.responses.create(
            model=MODEL,
            input="stop early",
            max_output_tokens=9,
            extra_body={"mock_fault": "stop-after=3"},
            **headers(rid),
        )
        assert reply.status == "completed"
        response = (await stack.joined(rid))["response"]
        assert response["choices"][0]["finish_reason"] == "stop"
        assert response["output_tokens"] == 3

    async def test_failed_after_the_200(self, stack: Stack) -> None:
        rid = new_id()
        stream = await stack.client.responses.create(
            model=MODEL,
            input="fail",
            max_output_tokens=9,
            stream=True,
            extra_body={"mock_fault": "error-event-after=2"},
            **headers(rid),
        )
        kinds = [event.type async for event in stream]
        assert kinds[-1] == "response.failed"
        response = (await stack.joined(rid))["response"]
        assert (response["outcome"], response["error"]) == ("error", "worker died")
        assert response["http_status"] == 200

    async def test_client_goes_away(self, stack: Stack) -> None:
        rid = new_id()
        stream = await stack.client.responses.create(
            model=MODEL, input="a long one", max_output_tokens=2000, stream=True, **headers(rid)
        )
        async for event in stream:
            if event.type == "response.output_text.delta":
                break
        await stream.close()
        response = (await stack.joined(rid))["response"]
        assert response["outcome"] == "cancelled"
        assert 0 < response["output_tokens"] < 2000

    async def test_state_kept_by_the_frontend_is_not_mirrored(self, stack: Stack) -> None:
        before = stack.metric("shadow_not_mirrored_total", reason="previous_response")
        rid = new_id()
        with pytest.raises(openai.APIStatusError) as raised:
            await stack.client.responses.create(
                model=MODEL, input="hi", previous_response_id="resp_0", **headers(rid)
            )
        assert raised.value.status_code == 501
        await wait_until(
            lambda: (
                stack.metric("shadow_not_mirrored_total", reason="previous_response") == before + 1
            ),
            timeout=5,
        )
        assert stack.records.get(JOINED, rid) is None


class TestBatchCompletions:
    """``client.completions.create`` with several prompts: one record per prompt."""

    @pytest.mark.parametrize("stream", [False, True], ids=["unary", "streaming"])
    async def test_records_per_prompt(self, stack: Stack, stream: bool) -> None:
        rid = new_id()
        prompts = ["alpha beta", "gamma delta epsilon", "zeta"]
        extra = {"stream_options": {"include_usage": True}} if stream else {}
        reply = await stack.client.completions.create(
            model=MODEL, prompt=prompts, max_tokens=3, n=2, stream=stream, **extra, **headers(rid)
        )
        texts: dict[int, str] = {}
        if stream:
            usage = None
            async for chunk in reply:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    texts[choice.index] = texts.get(choice.index, "") + choice.text
        else:
            usage = reply.usage
            texts = {choice.index: choice.text for choice in reply.choices}
        keys = [(rid, i) for i in range(3)]
        joined = await stack.records.wait(JOINED, keys)
        plain = await stack.records.wait(REQUESTS, keys)
        assert sum(len(joined[k]["request"]["token_ids"]) for k in keys) == usage.prompt_tokens
        assert sum(joined[k]["response"]["output_tokens"] for k in keys) == usage.completion_tokens
        for i, key in enumerate(keys):
            assert plain[key]["request"] == joined[key]["request"]
            response = joined[key]["response"]
            assert response["outcome"] == "complete"
            assert [(c["index"], c["text"]) for c in response["choices"]] == [
                (0, texts[2 * i]),
                (1, texts[2 * i + 1]),
            ]
        await asyncio.sleep(0)
