"""The record's request, field by field, against what the real Dynamo 1.6.1
frontend hands its engine (``tests/dynamo_recorder.py`` writes down every
PreprocessedRequest the worker receives).

Compared: token_ids, stop_conditions, sampling_options, output_options,
eos_token_ids, annotations, routing, extra_args, agent_context,
image_cache_scope (Dynamo's nulls left out, as records leave them out).
Deliberately different (docs/models.md, "Where the record differs"): ``mdc_sum`` (ours
hashes the tokenizer files), ``request_timestamp_ms`` (ours is the arrival time
when the request sets none), ``multi_modal_data`` (ours lists the media URLs).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from shadow_proxy.devtools.dynamo import REPO, Dynamo
from shadow_proxy.devtools.processes import reserve_endpoint
from tests.dynamo_recorder import start_recorder
from tests.support.dynamo import require_dynamo
from tests.support.servers import proxy_config, run_proxy
from tests.support.subscriber import TapSubscriber

pytestmark = [pytest.mark.dynamo, pytest.mark.timeout(300)]
in_module_loop = pytest.mark.asyncio(loop_scope="module")

MODEL = "chatml"
CORPUS_PATH = REPO / "tests" / "data" / "fidelity" / "corpus.jsonl"
CORPUS = [json.loads(line) for line in CORPUS_PATH.read_text(encoding="utf-8").split("\n") if line]
COMPARED = (
    "token_ids",
    "stop_conditions",
    "sampling_options",
    "output_options",
    "eos_token_ids",
    "annotations",
    "routing",
    "extra_args",
    "agent_context",
    "image_cache_scope",
)
TAP = "fields"
#: (corpus entry, field) where the record differs on purpose (README): with media,
#: Dynamo copies the messages and the rendered prompt into extra_args; the record
#: does not repeat the prompt (or inline image data) there.
DELIBERATE = {("image_data_url", "extra_args")}


def without_nulls(value):
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v not in (None, [], {})}
    return value


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def recorder(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Dynamo, Path]]:
    require_dynamo()
    scratch = tmp_path_factory.mktemp("recorder")
    out = scratch / "preprocessed.jsonl"
    dynamo = await start_recorder(REPO / ".models" / MODEL, MODEL, scratch, out)
    try:
        yield dynamo, out
    finally:
        await dynamo.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy(recorder) -> AsyncIterator[tuple[str, TapSubscriber, Path]]:
    dynamo, out = recorder
    endpoint = reserve_endpoint()
    taps = [
        {
            "name": TAP,
            "topic": TAP,
            "capture": "request",
            "endpoint": endpoint,
            "filters": ["keep-worker-pins"],
        }
    ]
    config = proxy_config(dynamo.base_url, models={MODEL: REPO / ".models" / MODEL}, taps=taps)
    with TapSubscriber(endpoint, TAP) as records:
        async with run_proxy(config) as (url, _registry, _app):
            await records.wait_heartbeats(2, timeout=15)
            yield url, records, out


@in_module_loop
class TestPreprocessedRequest:
    async def test_fields_equal_the_frontends(self, proxy) -> None:
        url, records, out = proxy
        differences = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            for entry in CORPUS:
                body = {**entry["body"], "model": MODEL}
                path = "/v1/chat/completions" if entry["api"] == "chat" else "/v1/completions"
                before = len(out.read_text(encoding="utf-8").split("\n"))
                async with session.post(
                    url + path, json=body, headers=entry.get("headers", {})
                ) as response:
                    await response.read()
                    assert response.status == 200, entry["name"]
                    rid = response.headers["x-request-id"]
                await records.wait_requests([rid], timeout=15)
                lines = [x for x in out.read_text(encoding="utf-8").split("\n") if x]
                assert len(lines) == before, entry["name"]  # exactly one more request
                engine = without_nulls(json.loads(lines[-1]))
                ours = records.of(rid)[-1]["request"]
                for field in COMPARED:
                    if (entry["name"], field) in DELIBERATE:
                        continue
                    if ours.get(field) != engine.get(field):
                        differences.append(
                            (entry["name"], field, ours.get(field), engine.get(field))
                        )
        assert not differences, "\n".join(map(str, differences))
