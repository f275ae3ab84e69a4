"""The proxy in front of the real Dynamo 1.6.1 frontend and mocker (issues 3, 5 and 6).

One Dynamo for the module: a frontend, a mocker serving the deepseek model
directory as ``deepseek`` and one serving the chatml directory as ``chatml``
(a second endpoint behind the same frontend). One proxy in front of it, run as
the tests run it (``tests.support.servers.run_proxy``), with the reference taps on
loopback ports: ``kv-history-tracker`` (``capture: request``) and
``shadow-replay`` (joined); a test subscriber on each collects every record.

Facts about Dynamo 1.6.1 these tests lean on (see ``devtools/dynamo.py``):
the mocker requires ``max_tokens``; it answers ``n > 1`` with one choice; a
SIGKILLed mocker leaves the client an HTTP 200 stream ending with an error event
and ``[DONE]``. Dynamo renders tool-call arguments with minijinja, which prints
non-ASCII escapes and ``true``/``null`` differently from jinja2: the fidelity
set keeps tool-call arguments to ASCII strings and numbers (a known limitation).

Left out of the fidelity set because the proxy and Dynamo disagree on whether to
serve them, not on the tokens: a prompt at or above the model's context length
(the proxy does not mirror it, ``prompt_too_long``; the 1.6.1 mocker serves it);
completions token ids beyond the vocabulary (Dynamo answers 400, the proxy
mirrors the request, with an ``error`` record); an empty completions prompt
(Dynamo answers 400).
"""

from __future__ import annotations

import asyncio
import io
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from shadow_proxy.devtools.dynamo import REPO, Dynamo
from shadow_proxy.devtools.loadgen import LoadSpec, make_prompt
from shadow_proxy.devtools.processes import WaitTimeout, reserve_endpoint, wait_until
from shadow_proxy.devtools.reference_taps import JOINED_TAP, REQUEST_TAP, TAP_NAMES, reference_taps
from tests.support.dynamo import dynamo_with_mockers
from tests.support.servers import proxy_config, run_proxy
from tests.support.subscriber import TapSubscriber

pytestmark = [pytest.mark.dynamo, pytest.mark.timeout(240)]
in_module_loop = pytest.mark.asyncio(loop_scope="module")

MODELS = REPO / ".models"
#: The mockers' --speedup-ratio: ~3 ms per output token (the built-in frontend
#: of the demo takes 5). Faster, a 32-token stream can end before the cancel of
#: a client that closes after the first content chunk reaches the proxy: at 100,
#: 10 of the demo's 51 cancelled requests were recorded ``complete`` (the proxy had
#: written the whole answer before it saw the client go).
SPEEDUP = 2.0
#: The mocker that is killed mid-stream: ~6 ms per token at speedup 1.
SLOW_SPEEDUP = 1.0
JOINED, REQUESTS = JOINED_TAP, REQUEST_TAP
TIMEOUT = aiohttp.ClientTimeout(total=120)


# --------------------------------------------------------------------------- fixtures


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dynamo(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Dynamo]:
    """The Dynamo frontend with a ``deepseek`` and a ``chatml`` mocker."""
    async with dynamo_with_mockers(tmp_path_factory.mktemp("dynamo"), SPEEDUP) as dynamo:
        yield dynamo


class Stack:
    """The proxy's URL and registry, the Dynamo behind it and a subscriber per tap."""

    def __init__(self, dynamo: Dynamo, url: str, registry, taps: dict[str, TapSubscriber]) -> None:
        self.dynamo, self.url, self.registry, self.taps = dynamo, url, registry, taps

    async def records(self, tap: str, request_ids: list[str], timeout: float = 30) -> dict:
        """The tap's record of each request; fails naming the missing ones."""
        return await self.taps[tap].wait_requests(request_ids, timeout)

    def with_usage(self) -> int:
        """Joined records whose response carries ``usage.prompt_tokens``."""
        records = self.taps[JOINED].received().records
        return sum(
            type((r["response"].get("usage") or {}).get("prompt_tokens")) is int for r in records
        )

    def metric(self, name: str) -> float:
        """The sum of a relayed worker counter over its labels."""
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name:
                    total += sample.value
        return total


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(dynamo: Dynamo):
    """The proxy in front of Dynamo with the reference taps, each read by a
    ``TapSubscriber`` that has seen its tap's heartbeat before any request."""
    taps = reference_taps([reserve_endpoint() for _ in TAP_NAMES])
    models = {
        "deepseek": MODELS / "deepseek",
        "chatml": MODELS / "chatml",
        "deepseek-slow": MODELS / "deepseek",
    }
    config = proxy_config(dynamo.base_url, models=models, taps=taps)
    subscribers = {t["name"]: TapSubscriber(t["endpoint"], t["topic"]) for t in taps}
    try:
        async with run_proxy(config) as (url, registry, _app):
            for subscriber in subscribers.values():
                await subscriber.wait_heartbeats(timeout=30)
            yield Stack(dynamo, url, registry, subscribers)
    finally:
        for subscriber in subscribers.values():
            subscriber.close()


# --------------------------------------------------------------------------- clients


class Answer:
    def __init__(self, request_id: str, status: int, body: bytes, usage: dict | None) -> None:
        self.request_id, self.status, self.body, self.usage = request_id, status, body, usage


def _sse_usage(body: bytes) -> dict | None:
    usage = None
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            found = json.loads(line[6:]).get("usage")
            usage = found or usage
    return usage


async def send(
    session: aiohttp.ClientSession, url: str, api: str, body: dict, headers: dict | None = None
) -> Answer:
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    async with session.post(url + path, json=body, headers=headers) as response:
        data = await response.read()
        rid = response.headers["x-request-id"]
        if response.status != 200:
            return Answer(rid, response.status, data, None)
        usage = _sse_usage(data) if body.get("stream") else json.loads(data).get("usage")
        return Answer(rid, response.status, data, usage)


async def send_all(
    url: str, requests: list[tuple[str, dict]], concurrency: int = 8
) -> list[Answer]:
    limit = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:

        async def one(api: str, body: dict) -> Answer:
            async with limit:
                return await send(session, url, api, body)

        return await asyncio.gather(*(one(api, body) for api, body in requests))


# --------------------------------------------------------------------------- issue 3


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
UNICODE = [
    "Hello, 世界 🙂 123",
    "naïve café — ünïcödé",
    "emoji 👩‍👩‍👧‍👦🏳️‍🌈🚀",
    "Здравствуйте, мир",
    "עברית ועربية",
    "\t tabs \n\n and  spaces  ",
]


def fidelity_requests(seed: int = 3) -> list[tuple[str, dict]]:
    """Varied chat and completions requests (always with ``max_tokens``)."""
    rng = random.Random(seed)
    out: list[tuple[str, dict]] = []

    def words(n: int) -> str:
        return make_prompt(rng, n)

    def chat(messages: list[dict], model: str = "deepseek", **extra: Any) -> None:
        body = {"model": model, "messages": messages, "max_tokens": rng.randint(1, 8), **extra}
        out.append(("chat", body))

    def completion(prompt: Any, model: str = "deepseek", **extra: Any) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": rng.randint(1, 8), **extra}
        out.append(("completions", body))

    for model in ("deepseek", "chatml"):
        for _ in range(24):
            chat([{"role": "user", "content": words(rng.randint(1, 60))}], model)
        for text in UNICODE:
            chat([{"role": "user", "content": text}], model)
        chat([{"role": "user", "content": ""}], model)
        chat([{"role": "system", "content": ""}, {"role": "user", "content": ""}], model)
        for _ in range(12):
            chat(
                [
                    {"role": "system", "content": "You are terse. " + words(rng.randint(1, 30))},
                    {"role": "user", "content": words(rng.randint(1, 40))},
                ],
                model,
            )
        for turns in (1, 2, 3, 5, 8, 12):
            messages = [{"role": "system", "content": "Be brief."}]
            for t in range(turns):
                messages.append({"role": "user", "content": f"turn {t}: " + words(12)})
                messages.append({"role": "assistant", "content": words(rng.randint(1, 20))})
            messages.append({"role": "user", "content": rng.choice(UNICODE)})
            chat(messages, model)
        for parts in (1, 2, 3):
            content = [{"type": "text", "text": words(rng.randint(1, 15))} for _ in range(parts)]
            chat([{"role": "user", "content": content}], model)
            chat(
                [
                    {"role": "system", "content": [{"type": "text", "text": "sys"}] * parts},
                    {"role": "user", "content": content},
                ],
                model,
            )
        chat([{"role": "user", "content": [{"type": "text", "text": ""}]}], model)
        chat(
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "🙂"}, {"type": "text", "text": "世界"}],
                }
            ],
            model,
        )
        # tools, tool_choice, tool calls and their results
        question = [{"role": "user", "content": "Weather in Paris?"}]
        chat(question, model, tools=[WEATHER_TOOL])
        chat(question, model, tools=[WEATHER_TOOL], tool_choice="auto")
        chat(question, model, tools=[WEATHER_TOOL], tool_choice="none")
        chat(
            question,
            model,
            tools=[
                WEATHER_TOOL,
                {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "name": "get_time"}},
            ],
        )
        for args in ('{"city": "Paris"}', '{"city": "Oslo", "days": 3}', "{}"):
            call = {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": args},
            }
            chat(
                [
                    *question,
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
                ],
                model,
                tools=[WEATHER_TOOL],
            )
        # sampling, stop and output options
        simple = [{"role": "user", "content": "Count to ten."}]
        chat(simple, model, n=2)
        chat(simple, model, logprobs=True)
        chat(simple, model, logprobs=True, top_logprobs=3)
        chat(simple, model, ignore_eos=True)
        chat(simple, model, stop=["five", "\n"])
        chat(simple, model, stop="six")
        chat(simple, model, seed=7, temperature=0.7, top_p=0.9)
        chat(simple, model, temperature=0.0, presence_penalty=0.5, frequency_penalty=0.5)
        chat(simple, model, max_completion_tokens=3)
        chat(simple, model, stream=True, stream_options={"include_usage": True})
        chat(
            [{"role": "user", "content": rng.choice(UNICODE)}],
            model,
            stream=True,
            stream_options={"include_usage": True},
            ignore_eos=True,
        )
        # long prompts
        # (chatml spends ~4 tokens a word with its 581-token vocabulary; context 8192)
        for n in (1000, 2000, 4000) if model == "deepseek" else (500, 1000, 1800):
            chat([{"role": "user", "content": words(n)}], model)
        # completions
        for _ in range(12):
            completion(words(rng.randint(1, 80)), model)
        for text in UNICODE:
            completion(text, model)
        completion([words(20)], model)
        completion([rng.randrange(10, 500) for _ in range(rng.randint(1, 50))], model)
        completion([[rng.randrange(10, 500) for _ in range(17)]], model)
        completion(words(20), model, logprobs=2)
        completion(words(20), model, stop=["the"], seed=1, n=2)
        completion(words(20), model, ignore_eos=True)
        completion(words(3000 if model == "deepseek" else 1800), model)
        completion(words(20), model, stream=True, stream_options={"include_usage": True})
    return out


@in_module_loop
class TestPromptFidelity:
    """Issue 3: the rebuilt prompt has as many tokens as Dynamo's own preprocessing."""

    async def test_prompt_tokens_equal_dynamo_usage(self, stack: Stack) -> None:
        requests = fidelity_requests()
        assert len(requests) >= 200
        answers = await send_all(stack.url, requests)
        failed = [
            (r, a.status, a.body[:200])
            for r, a in zip(requests, answers, strict=True)
            if a.status != 200
        ]
        assert not failed, "\n".join(map(str, failed))
        ids = [a.request_id for a in answers]
        by_id = {a.request_id: r for r, a in zip(requests, answers, strict=True)}
        try:
            joined = await stack.records(JOINED, ids)
        except WaitTimeout:
            arrived = {r["request_id"] for r in stack.taps[JOINED].received().records}
            lost = [by_id[i] for i in ids if i not in arrived]
            not_mirrored = {
                s.labels["reason"]: s.value
                for f in stack.registry.collect()
                for s in f.samples
                if s.name == "shadow_not_mirrored_total"
            }
            pytest.fail(f"not mirrored {not_mirrored}: {lost}")
        plain = await stack.records(REQUESTS, ids)

        mismatched = []
        for (api, body), answer in zip(requests, answers, strict=True):
            record = joined[answer.request_id]
            reported = record["response"]["usage"]["prompt_tokens"]
            rebuilt = len(record["request"]["token_ids"])
            assert answer.usage["prompt_tokens"] == reported
            assert (
                plain[answer.request_id]["request"]["token_ids"] == record["request"]["token_ids"]
            )
            if rebuilt != reported:
                mismatched.append((api, body, rebuilt, reported))
        assert not mismatched, f"{len(mismatched)} of {len(requests)}: {mismatched[:3]}"

        # Every joined record with usage so far is one check; the worker relays
        # its counters once a second.
        await wait_until(
            lambda: stack.metric("shadow_prompt_token_checks_total") == stack.with_usage(),
            timeout=10,
        )
        assert stack.with_usage() >= len(requests)
        assert stack.metric("shadow_prompt_token_mismatches_total") == 0


# --------------------------------------------------------------------------- issue 5


def _output_requests(stream: bool, count: int, seed: int) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        api = "chat" if i % 3 else "completions"
        body: dict[str, Any] = {
            "model": "deepseek" if i % 4 else "chatml",
            "max_tokens": rng.randint(1, 48),
            "stream": stream,
        }
        if i % 5 == 0:
            body["ignore_eos"] = True
        if stream:
            body["stream_options"] = {"include_usage": True}
        prompt = f"request {i}: " + make_prompt(rng, rng.randint(4, 200))
        if api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        out.append((api, body))
    return out


@in_module_loop
class TestOutcomes:
    """Issue 5: outcomes and output tokens as the frontend reported them to the client."""

    @pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
    async def test_complete_and_output_tokens(self, stack: Stack, stream: bool) -> None:
        requests = _output_requests(stream, 200, seed=11 + stream)
        answers = await send_all(stack.url, requests, concurrency=16)
        assert all(a.status == 200 for a in answers)
        if stream:
            assert all(a.body.rstrip().endswith(b"data: [DONE]") for a in answers)
        records = await stack.records(JOINED, [a.request_id for a in answers])
        assert len(records) == 200
        outcomes = [r["response"]["outcome"] for r in records.values()]
        assert outcomes.count("complete") == 200, outcomes
        for answer in answers:
            response = records[answer.request_id]["response"]
            assert response["output_tokens"] == answer.usage["completion_tokens"]
            assert [c["finish_reason"] for c in response["choices"]] in (["length"], ["stop"])

    async def test_mocker_killed_mid_stream(self, stack: Stack) -> None:
        """SIGKILL of the engine: ``error`` records for the requests in flight, and the
        proxy keeps serving."""
        slow = await stack.dynamo.add_mocker(
            MODELS / "deepseek", "deepseek-slow", speedup=SLOW_SPEEDUP
        )
        in_flight = 4
        started = [asyncio.Event() for _ in range(in_flight)]

        async def stream_until_end(session: aiohttp.ClientSession, i: int) -> tuple[str, bytes]:
            body = {
                "model": "deepseek-slow",
                "messages": [{"role": "user", "content": f"Tell me a long story, {i}."}],
                "max_tokens": 4000,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with session.post(stack.url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
                data = b""
                async for chunk in response.content.iter_any():
                    data += chunk
                    if data.count(b'"content"') >= 3:
                        started[i].set()
                return response.headers["x-request-id"], data

        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            tasks = [asyncio.create_task(stream_until_end(session, i)) for i in range(in_flight)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
            await asyncio.to_thread(stack.dynamo.kill_mocker, slow)
            ended = await asyncio.wait_for(asyncio.gather(*tasks), 60)

        for _, data in ended:
            assert b'"finish_reason":"length"' not in data
            assert b"Service temporarily unavailable" in data
        records = await stack.records(JOINED, [rid for rid, _ in ended])
        for record in records.values():
            response = record["response"]
            assert response["outcome"] == "error", response
            assert response["http_status"] == 200
            assert "unavailable" in response["error"]
            assert 3 <= response["output_tokens"] < 4000

        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            async with session.get(stack.url + "/healthz") as r:
                assert r.status == 200
                assert (await r.json())["status"] == "ok"
            body = {
                "model": "deepseek",
                "max_tokens": 4,
                "stream": True,
                "messages": [{"role": "user", "content": "still there?"}],
            }
            answer = await send(session, stack.url, "chat", body)
        assert answer.status == 200
        assert answer.body.rstrip().endswith(b"data: [DONE]")
        record = (await stack.records(JOINED, [answer.request_id]))[answer.request_id]
        assert record["response"]["outcome"] == "complete"


# --------------------------------------------------------------------------- issue 6


# The demo's checks count a client's cancels against the records exactly: which of
# a cancel and an answer's end comes first is the host's timing (solo: alone).
@pytest.mark.solo
class TestDemo:
    """Issues 6, 15 and 16: the demo's four reference runs (the fourth on the Responses
    API) and its multi-turn run in front of Dynamo hold their accounting; the replay
    run, which needs built-in frontends, is left out and says so."""

    @pytest.mark.timeout(600)
    def test_reference_and_multi_turn_runs(self, dynamo: Dynamo, tmp_path: Path) -> None:
        """``shadow-proxy demo --frontend`` (its own proxy and consumers, as
        processes) against the module's Dynamo; the tables are printed (``-s``)
        and kept in ``demo-tables.txt`` of the test's tmp dir."""
        from shadow_proxy.devtools.demo import run_demo

        results = tmp_path / "demo.json"
        out = io.StringIO()
        argv = [
            "--frontend",
            dynamo.base_url,
            "--model",
            "deepseek",
            "--tokenizer",
            str(MODELS / "deepseek"),
            "--out",
            str(tmp_path / "out"),
            "--json",
            str(results),
        ]
        status = run_demo(argv, out=out)
        tables = out.getvalue()
        (tmp_path / "demo-tables.txt").write_text(tables, encoding="utf-8")
        print(tables)
        assert status == 0, tables
        assert "left out: the replay run needs the built-in frontends" in tables
        runs = json.loads(results.read_text())["runs"]
        reference, multi = runs[:4], runs[4:]
        assert [
            (r["load"]["api"], r["load"]["stream"], r["load"]["cancel_fraction"]) for r in reference
        ] == [
            ("chat", True, 0.0),
            ("chat", False, 0.0),
            ("chat", True, 0.25),
            ("responses", True, 0.25),
        ]
        spec = LoadSpec(url="", model="deepseek", cancel_fraction=0.25)
        for run in reference:
            clients, taps = run["clients"], run["taps"]
            assert clients["requests"] == 200
            assert clients["errors"] == 0
            for name in (REQUESTS, JOINED):
                tap = taps[name]
                assert tap["records"] == 200
                assert tap["prompt_tokens"] == clients["frontend_prompt_tokens"]
                assert tap["tap_gaps"] == tap["transport_gaps"] == 0
                assert tap["tail_loss"] == tap["transport_tail_loss"] == 0
            outcomes = taps[JOINED]["outcomes"]
            # A cancel may come after the proxy wrote the whole (short, fast)
            # answer: complete, rightly (demo/checks.py); never the other way.
            assert outcomes.get("cancelled", 0) <= clients["cancelled"]
            assert outcomes.get("complete", 0) >= clients["ok"]
            assert sum(outcomes.values()) == 200
            assert run["proxy"]["prompt_token_mismatches"] == 0
            route = run["load"]["api"]
            assert run["proxy"]["requests"][f"{route} 2xx"] == clients["ok"]
            if run["load"]["cancel_fraction"]:
                assert clients["cancelled"] == sum(map(spec.cancels, range(200))) > 0
                # Cancelled requests' prompts: Dynamo asked again (usage.input_tokens
                # for the Responses API).
                assert clients["prompt_tokens_asked_again"] == clients["cancelled"]
            else:
                assert clients["cancelled"] == 0
                assert clients["prompt_tokens"] == clients["frontend_prompt_tokens"]
        (run,) = multi
        clients, taps = run["clients"], run["taps"]
        assert (run["kind"], clients["requests"], clients["ok"]) == ("multi-turn", 160, 160)
        for name in (REQUESTS, JOINED):
            assert taps[name]["records"] == 160
            assert taps[name]["prompt_tokens"] == clients["frontend_prompt_tokens"]
        assert taps[JOINED]["outcomes"] == {"complete": 160}
        assert run["proxy"]["prompt_token_mismatches"] == 0
        # The session header reached the records (Dynamo reads it too), and every
        # turn resent its conversation's history.
        assert run["sessions"]["sessions"] == 20 and run["sessions"]["turns_per_session"] == [8]
        assert run["sessions"]["turns_not_extending"] == 0
        for row in run["reuse"]["block_sizes"]:
            assert row["requests"] == 160
            assert row["prompt_tokens"] == clients["frontend_prompt_tokens"]
            assert 0.5 < row["hit_rate_infinite"] < 1
        assert run["exit_status"]["shadow-trace"] == 0
