"""Issue 13's proof: the fidelity corpus through the proxy in front of the real
Dynamo 1.6.1 frontend (two mockers: ``deepseek`` and ``chatml``).

For every request of tests/data/fidelity/corpus.jsonl and both models:
- the frontend answers 200 and its ``usage.prompt_tokens`` equals the length
  of the record's ``token_ids``; ``shadow_prompt_token_mismatches_total`` stays 0;
- sent again with ``nvext.annotations: ["token_ids"]``, the prompt token ids the
  frontend streams back equal the record's, id for id (chat and text
  completions; the frontend sends none for prompts given as a list).

The corpus grows with every difference found (one request per line: ``name``,
``api``, ``body`` without ``model``, optional ``headers`` and ``note``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from shadow_proxy.devtools.dynamo import REPO, Dynamo
from shadow_proxy.devtools.processes import reserve_endpoint, wait_until
from tests.support.dynamo import dynamo_with_mockers
from tests.support.servers import proxy_config, run_proxy
from tests.support.subscriber import TapSubscriber

pytestmark = [pytest.mark.dynamo, pytest.mark.timeout(600)]
in_module_loop = pytest.mark.asyncio(loop_scope="module")

MODELS = REPO / ".models"
CORPUS_PATH = REPO / "tests" / "data" / "fidelity" / "corpus.jsonl"
# split("\n"), not splitlines(): a line may hold U+2028, which splitlines() breaks at.
CORPUS = [json.loads(line) for line in CORPUS_PATH.read_text(encoding="utf-8").split("\n") if line]
MODEL_NAMES = ("deepseek", "chatml")
TAP = "fidelity"
TIMEOUT = aiohttp.ClientTimeout(total=120)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dynamo(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Dynamo]:
    async with dynamo_with_mockers(tmp_path_factory.mktemp("dynamo"), 1000) as dynamo:
        yield dynamo


class Records(TapSubscriber):
    """The tap's records by request id (the last one of each)."""

    @property
    def by_id(self) -> dict[str, dict]:
        return {r["request_id"]: r for r in self.received().records}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(dynamo: Dynamo) -> AsyncIterator[tuple[str, object, Records]]:
    endpoint = reserve_endpoint()
    taps = [
        {
            "name": TAP,
            "topic": TAP,
            "capture": "request_response",
            "endpoint": endpoint,
            "capacity": 4096,
        },
    ]
    models = {n: MODELS / n for n in MODEL_NAMES}
    config = proxy_config(dynamo.base_url, models=models, taps=taps)
    with Records(endpoint, TAP) as records:
        async with run_proxy(config) as (url, registry, _app):
            await records.wait_heartbeats(2, timeout=15)
            yield url, registry, records


def metric(registry, name: str) -> float:
    return sum(s.value for f in registry.collect() for s in f.samples if s.name == name)


def request_of(entry: dict, model: str, annotated: bool) -> dict:
    body = {**entry["body"], "model": model}
    body.setdefault("max_tokens", 3)  # the mocker requires it
    if body.get("stream"):
        body["stream_options"] = {"include_usage": True}
    if annotated:
        body["stream"] = True
        body.pop("stream_options", None)
        body["nvext"] = {**body.get("nvext", {}), "annotations": ["token_ids"]}
    return body


def _list_prompt(entry: dict) -> bool:
    """A completions prompt given as a list (token ids, or one text in a list):
    1.6.1 streams no prompt ids for those; their length is checked on usage."""
    return entry["api"] == "completions" and isinstance(entry["body"].get("prompt"), list)


def _usage_and_ids(data: bytes, stream: bool) -> tuple[dict | None, list[int] | None]:
    if not stream:
        return json.loads(data).get("usage"), None
    usage, ids, event = None, None, None
    for line in data.decode().split("\n"):
        if line.startswith("event:"):
            event = line[6:].strip()
        elif event == "token_ids" and line.startswith((":", "data:")):
            found = re.findall(r"\[[0-9, ]*\]", line)
            ids = json.loads(found[0]) if found else ids
        elif line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage") or usage
        elif not line:
            event = None
    return usage, ids


async def send_corpus(url: str, annotated: bool) -> list[tuple[str, str, dict]]:
    """Every corpus request for both models: (model/name, request id, answer)."""
    limit = asyncio.Semaphore(8)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:

        async def one(model: str, entry: dict) -> tuple[str, str, dict]:
            body = request_of(entry, model, annotated)
            path = "/v1/chat/completions" if entry["api"] == "chat" else "/v1/completions"
            async with (
                limit,
                session.post(url + path, json=body, headers=entry.get("headers", {})) as response,
            ):
                data = await response.read()
                usage, ids = (None, None)
                if response.status == 200:
                    usage, ids = _usage_and_ids(data, bool(body.get("stream")))
                answer = {"status": response.status, "usage": usage, "ids": ids, "body": data[:300]}
                return f"{model}/{entry['name']}", response.headers["x-request-id"], answer

        return await asyncio.gather(
            *(one(model, entry) for model in MODEL_NAMES for entry in CORPUS)
        )


@in_module_loop
class TestCorpus:
    """The whole corpus, both models: the record's prompt is the frontend's."""

    async def test_prompt_tokens_equal_usage(self, stack) -> None:
        url, registry, records = stack
        answers = await send_corpus(url, annotated=False)
        failed = [(key, a["status"], a["body"]) for key, _, a in answers if a["status"] != 200]
        assert not failed, failed
        ids = [rid for _, rid, _ in answers]
        await records.wait_requests(ids, timeout=60)
        by_id = records.by_id
        mismatched = []
        for key, rid, answer in answers:
            record = by_id[rid]
            # (with tool_choice required or named, 1.6.1 + the mocker answer
            # finish_reason null: the record says incomplete, as the client saw)
            assert record["response"]["http_status"] == 200, key
            rebuilt = len(record["request"]["token_ids"])
            if answer["usage"]["prompt_tokens"] != rebuilt:
                mismatched.append((key, rebuilt, answer["usage"]["prompt_tokens"]))
        assert not mismatched, mismatched
        assert len(answers) == 2 * len(CORPUS) >= 120
        await wait_until(
            lambda: metric(registry, "shadow_prompt_token_checks_total") >= len(answers),
            timeout=15,
        )
        assert metric(registry, "shadow_prompt_token_mismatches_total") == 0
        print(f"\nfidelity corpus: {len(answers)} requests, 0 prompt-token mismatches")

    async def test_token_ids_equal_the_frontends(self, stack) -> None:
        url, _registry, records = stack
        answers = await send_corpus(url, annotated=True)
        assert all(a["status"] == 200 for _, _, a in answers)
        await records.wait_requests([rid for _, rid, _ in answers], timeout=60)
        by_id = records.by_id
        compared, differing, without_ids = 0, [], set()
        for key, rid, answer in answers:
            if answer["ids"] is None:  # list prompts: the frontend sends none
                without_ids.add(key)
                continue
            compared += 1
            if by_id[rid]["request"]["token_ids"] != answer["ids"]:
                differing.append(key)
        assert not differing, differing
        list_prompts = {f"{m}/{e['name']}" for m in MODEL_NAMES for e in CORPUS if _list_prompt(e)}
        assert without_ids == list_prompts, without_ids ^ list_prompts
        print(f"\nfidelity corpus: {compared} prompts equal to the frontend's, id for id")
