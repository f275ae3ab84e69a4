"""The ``dynamo`` export equals Dynamo's own request trace, request for request.

Real parts: Dynamo 1.6.1's frontend and mocker (``make dynamo``) with its request
trace on (``DYN_REQUEST_TRACE=1``, the ``jsonl`` sink), the proxy in front of it
with a joined tap, a test subscriber collecting the records, a record file, and the
``shadow-trace export --format dynamo`` command. Dynamo 1.6.1's trace does not
carry the client's request id, so the two traces are compared as multisets of
``(input_length, input_sequence_hashes)``, for chat and completions, short and
multi-block prompts, and multi-turn conversations.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from shadow_proxy.devtools.dynamo import Dynamo, start_dynamo
from shadow_proxy.devtools.processes import reserve_endpoint, wait_until
from shadow_proxy.trace.cli import main as trace_main
from tests.support import MODELS_DIR
from tests.support.dynamo import require_dynamo
from tests.support.servers import proxy_config, run_proxy
from tests.support.subscriber import TapSubscriber
from tests.support.trace_records import write_records

pytestmark = [
    pytest.mark.dynamo,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="module"),
]

TAP = "trace-joined"
TIMEOUT = aiohttp.ClientTimeout(total=120)
WORDS = "shadow proxy mirrors traffic as the engine sees it while caches keep prefixes".split()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dynamo(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Dynamo, Path]]:
    """Dynamo with its request trace on (the frontend writes it)."""
    require_dynamo()
    scratch = tmp_path_factory.mktemp("dynamo-trace")
    trace_path = scratch / "request-trace.jsonl"
    trace_env = {
        "DYN_REQUEST_TRACE": "1",
        "DYN_REQUEST_TRACE_SINKS": "jsonl",
        "DYN_REQUEST_TRACE_OUTPUT_PATH": str(trace_path),
        "DYN_REQUEST_TRACE_JSONL_FLUSH_INTERVAL_MS": "50",
    }
    dynamo = await start_dynamo(
        MODELS_DIR / "deepseek", "deepseek", scratch, speedup=1000, extra_frontend_env=trace_env
    )
    try:
        yield dynamo, trace_path
    finally:
        await dynamo.aclose()


def dynamo_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line)["event"] for line in lines if line.strip()]


def workload(seed: int = 5) -> list[tuple[str, dict]]:
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    out: list[tuple[str, dict]] = []
    for n in (3, 40, 200):  # one block, a few, many
        out.append(("completions", {"prompt": text(n)}))
        out.append(("completions", {"prompt": [rng.randrange(1000, 30000) for _ in range(n)]}))
        out.append(("chat", {"messages": [{"role": "user", "content": text(n)}]}))
    for conversation in range(2):  # multi-turn: each turn grows on its own history
        messages = [{"role": "system", "content": f"assistant {conversation}. " + text(90)}]
        for _ in range(3):
            messages = [*messages, {"role": "user", "content": text(rng.randint(5, 80))}]
            out.append(("chat", {"messages": list(messages)}))
            messages = [*messages, {"role": "assistant", "content": text(20)}]
    return out


async def send(session: aiohttp.ClientSession, url: str, api: str, body: dict) -> str:
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    body = {"model": "deepseek", "max_tokens": 3, **body}
    async with session.post(url + path, json=body) as response:
        await response.read()
        assert response.status == 200
        return response.headers["x-request-id"]


@pytest_asyncio.fixture(loop_scope="module")
async def proxy(dynamo):
    """The proxy in front of Dynamo with one joined tap, read by a test subscriber
    that has seen the tap's heartbeat (no record is sent before it subscribed)."""
    procs, _ = dynamo
    endpoint = reserve_endpoint()
    taps = [
        {
            "name": TAP,
            "topic": TAP,
            "capture": "request_response",
            "emit": "joined",
            "endpoint": endpoint,
            "capacity": 1024,
        }
    ]
    models = {"deepseek": MODELS_DIR / "deepseek"}
    with TapSubscriber(endpoint, TAP) as subscriber:
        async with run_proxy(proxy_config(procs.base_url, models=models, taps=taps)) as started:
            await subscriber.wait_heartbeats(timeout=30)
            yield started[0], subscriber


class TestDynamoExportEqualsDynamosTrace:
    async def test_multisets_equal(self, dynamo, proxy, tmp_path):
        _, trace_path = dynamo
        url, collector = proxy
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            await asyncio.sleep(0.01)
            start_ms = int(time.time() * 1000) + 1
            await asyncio.sleep(0.01)
            requests = workload()
            ids = [await send(session, url, api, body) for api, body in requests]
        found = await collector.wait_requests(ids, timeout=30)
        envelopes = [found[i] for i in ids]
        records = write_records(tmp_path / "records.bin", envelopes)
        out = tmp_path / "dynamo.jsonl"
        code = await asyncio.to_thread(
            trace_main, ["export", str(records), "--format", "dynamo", "-o", str(out)]
        )
        assert code == 0
        ours = [json.loads(line)["event"] for line in out.read_text().splitlines()]

        def theirs() -> list[dict]:
            rows = [
                r
                for r in dynamo_rows(trace_path)
                if r["request"]["request_received_ms"] >= start_ms
            ]
            return rows if len(rows) >= len(requests) else []

        rows = await wait_until(theirs, 30, 0.05, what="Dynamo's request trace of the workload")

        def key(row: dict) -> tuple:
            replay = row["request"]["replay"]
            return (
                replay["trace_block_size"],
                replay["input_length"],
                tuple(replay["input_sequence_hashes"]),
            )

        assert len(ours) == len(requests)
        assert Counter(map(key, ours)) == Counter(map(key, rows))
        assert any(len(k[2]) > 2 for k in map(key, ours))  # multi-block prompts were there
        assert Counter(r["request"]["output_tokens"] for r in ours) == Counter(
            r["request"]["output_tokens"] for r in rows
        )
