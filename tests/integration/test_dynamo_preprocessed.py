"""The record's request, field by field, against what the real Dynamo 1.6.1
frontend hands its engine (``tests/dynamo_recorder.py`` writes down every
PreprocessedRequest the worker receives).

Compared: token_ids, stop_conditions, sampling_options, output_options,
eos_token_ids, annotations, routing, extra_args, agent_context,
image_cache_scope (Dynamo's nulls left out, as records leave them out).
Deliberately different (README, "Where the record differs"): ``mdc_sum`` (ours
hashes the tokenizer files), ``request_timestamp_ms`` (ours is the arrival time
when the request sets none), ``multi_modal_data`` (ours lists the media URLs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

from shadow_proxy.records.wire import HEARTBEAT_SUFFIX, decode_envelope, decode_frames
from tests.conftest import free_port, proxy_config, require_dynamo, run_proxy, wait_for
from tests.dynamo_harness import REPO, DynamoProcs
from tests.dynamo_recorder import start_recorder

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


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DynamoProcs, Path]]:
    require_dynamo()
    scratch = tmp_path_factory.mktemp("recorder")
    out = scratch / "preprocessed.jsonl"
    procs = start_recorder(REPO / ".models" / MODEL, MODEL, scratch, out)
    try:
        yield procs, out
    finally:
        procs.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy(recorder) -> AsyncIterator[tuple[str, dict, Path]]:
    procs, out = recorder
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    taps = [{"name": TAP, "topic": TAP, "capture": "request", "endpoint": endpoint,
             "filters": ["keep-worker-pins"]}]  # fmt: skip
    config = proxy_config(
        procs.base_url,
        models=[{"name": MODEL, "tokenizer": str(REPO / ".models" / MODEL)}],
        taps=taps,
    )
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, TAP.encode())
    socket.connect(endpoint)
    records: dict = {"beats": 0}

    async def read() -> None:
        while True:
            message = decode_frames(await socket.recv_multipart())
            if message.topic.endswith(HEARTBEAT_SUFFIX):
                records["beats"] += 1
            else:
                envelope = decode_envelope(message.payload)
                records[envelope["request_id"]] = envelope

    task = asyncio.create_task(read())
    try:
        async with run_proxy(config) as (url, _registry, _app):
            await wait_for(lambda: records["beats"] >= 2, timeout=15)
            yield url, records, out
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        socket.close(linger=0)
        context.term()


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
                await wait_for(lambda rid=rid: rid in records, timeout=15)
                lines = [x for x in out.read_text(encoding="utf-8").split("\n") if x]
                assert len(lines) == before, entry["name"]  # exactly one more request
                engine = without_nulls(json.loads(lines[-1]))
                ours = records[rid]["request"]
                for field in COMPARED:
                    if (entry["name"], field) in DELIBERATE:
                        continue
                    if ours.get(field) != engine.get(field):
                        differences.append(
                            (entry["name"], field, ours.get(field), engine.get(field))
                        )
        assert not differences, "\n".join(map(str, differences))
