"""The ``dynamo`` export equals Dynamo's own request trace, request for request.

Real parts: Dynamo 1.6.1's frontend and mocker (``make dynamo``) with its request
trace on (``DYN_REQUEST_TRACE=1``, the ``jsonl`` sink), the proxy in front of it
with a joined tap, a SUB socket collecting the records, a record file, and the
``shadow-trace export --format dynamo`` command. Dynamo 1.6.1's trace does not
carry the client's request id, so the two traces are compared as multisets of
``(input_length, input_sequence_hashes)``, for chat and completions, short and
multi-block prompts, and multi-turn conversations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
import zmq

import tests.dynamo_harness as harness
from shadow_proxy.records import wire
from shadow_proxy.trace.cli import main as trace_main
from tests.conftest import MODELS_DIR, free_port, proxy_config, require_dynamo, run_proxy
from tests.trace_records import write_records

pytestmark = [pytest.mark.dynamo, pytest.mark.slow, pytest.mark.timeout(300)]

TAP = "trace-joined"
TIMEOUT = aiohttp.ClientTimeout(total=120)
WORDS = "shadow proxy mirrors traffic as the engine sees it while caches keep prefixes".split()


class Collector:
    """A SUB socket read by a thread: every record of the tap, by request id."""

    def __init__(self, endpoint: str) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, TAP.encode())
        self.socket.connect(endpoint)
        self.records: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self.stopping.is_set():
            if not poller.poll(50):
                continue
            message = wire.decode_frames(self.socket.recv_multipart())
            if message.topic == TAP:
                envelope = wire.decode_envelope(message.payload)
                with self.lock:
                    self.records[envelope["request_id"]] = envelope

    def get(self, request_ids: list[str]) -> list[dict] | None:
        with self.lock:
            found = [self.records.get(rid) for rid in request_ids]
        return None if None in found else found  # type: ignore[return-value]

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.socket.close()
        self.context.term()


async def poll(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def dynamo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.DynamoProcs, Path]]:
    require_dynamo()
    scratch = tmp_path_factory.mktemp("dynamo-trace")
    trace_path = scratch / "request-trace.jsonl"
    plain_env = harness.dynamo_env

    def traced_env(folder: Path) -> dict[str, str]:
        env = plain_env(folder)
        env.update(
            DYN_REQUEST_TRACE="1",
            DYN_REQUEST_TRACE_SINKS="jsonl",
            DYN_REQUEST_TRACE_OUTPUT_PATH=str(trace_path),
            DYN_REQUEST_TRACE_JSONL_FLUSH_INTERVAL_MS="50",
        )
        return env

    harness.dynamo_env = traced_env  # the harness builds each process's environment with it
    try:
        procs = harness.start_dynamo(MODELS_DIR / "deepseek", "deepseek", scratch, speedup=1000)
    finally:
        harness.dynamo_env = plain_env
    try:
        yield procs, trace_path
    finally:
        procs.stop()


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


@pytest_asyncio.fixture
async def proxy(dynamo):
    procs, _ = dynamo
    port = free_port()
    taps = [
        {
            "name": TAP,
            "topic": TAP,
            "capture": "request_response",
            "emit": "joined",
            "endpoint": f"tcp://127.0.0.1:{port}",
            "capacity": 1024,
        }
    ]
    models = [{"name": "deepseek", "tokenizer": str(MODELS_DIR / "deepseek")}]
    collector = Collector(f"tcp://127.0.0.1:{port}")
    try:
        async with run_proxy(proxy_config(procs.base_url, models=models, taps=taps)) as started:
            yield started[0], collector
    finally:
        collector.close()


class TestDynamoExportEqualsDynamosTrace:
    async def test_multisets_equal(self, dynamo, proxy, tmp_path):
        _, trace_path = dynamo
        url, collector = proxy
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            # ZeroMQ's slow joiner: probe until a record arrives
            deadline = time.monotonic() + 30
            while True:
                rid = await send(session, url, "completions", {"prompt": "probe"})
                with contextlib.suppress(pytest.fail.Exception):
                    await poll(lambda r=rid: collector.get([r]), 1, "probe record")
                    break
                if time.monotonic() > deadline:
                    pytest.fail("the tap's records never reached the SUB socket")
            await asyncio.sleep(0.01)
            start_ms = int(time.time() * 1000) + 1
            await asyncio.sleep(0.01)
            requests = workload()
            ids = [await send(session, url, api, body) for api, body in requests]
        envelopes = await poll(lambda: collector.get(ids), 30, "records of the workload")
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

        rows = await poll(theirs, 30, "Dynamo's request trace of the workload")

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
