"""Issue 13 through the real proxy and tap worker: compressed responses (br,
zstd) and the engine-header allow-list, with a real client, a real aiohttp
frontend and real SUB sockets reading the records."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import brotli
import pytest
import pytest_asyncio
import zmq
import zmq.asyncio
import zstandard
from aiohttp import web

from shadow_proxy.devtools.processes import reserve_port, wait_until
from shadow_proxy.records.wire import HEARTBEAT_SUFFIX, decode_envelope, decode_frames
from tests.support.servers import proxy_config, run_proxy, serve

pytestmark = pytest.mark.timeout(120)
in_module_loop = pytest.mark.asyncio(loop_scope="module")

MODEL = "chatml"
SEEN = web.AppKey("seen_headers", list)
WORDS = ["Hello", " wörld", ",", " the", " shadow", " keeps", " pace", "."]
SECRETS = [
    "Bearer sk-live-SECRET-authorization-0001",
    "session=SECRET-cookie-0002",
    "SECRET-api-key-0003",
    "SECRET-x-codex-api-key-0004",
    "SECRET-claude-token-0005",
    "SECRET-proxy-auth-0006",
    "SECRET-unlisted-0007",
]


# --------------------------------------------------------------------------- frontend


def _events(stream_usage: bool) -> list[bytes]:
    out = []
    for word in WORDS:
        chunk = {"id": "up-1", "choices": [{"index": 0, "delta": {"content": word}}]}
        out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    last = {"id": "up-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    out.append(b"data: " + json.dumps(last).encode() + b"\n\n")
    if stream_usage:
        usage = {"prompt_tokens": 5, "completion_tokens": len(WORDS), "total_tokens": 13}
        out.append(
            b"data: " + json.dumps({"id": "up-1", "choices": [], "usage": usage}).encode() + b"\n\n"
        )
    out.append(b"data: [DONE]\n\n")
    return out


class Compressor:
    """Compresses a body as a frontend would, flushing after each piece."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        if encoding == "br":
            self.obj = brotli.Compressor()
        else:
            self.obj = zstandard.ZstdCompressor().compressobj()

    def piece(self, data: bytes) -> bytes:
        if self.encoding == "br":
            return self.obj.process(data) + self.obj.flush()
        return self.obj.compress(data) + self.obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)

    def end(self) -> bytes:
        if self.encoding == "br":
            return self.obj.finish()
        return self.obj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    encoding = request.headers["x-test-encoding"]
    compressor = Compressor(encoding)
    request.app[SEEN].append(dict(request.headers))
    headers = {"Content-Encoding": encoding}
    if body.get("stream"):
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in _events(stream_usage=True):
            await response.write(compressor.piece(event))
        await response.write(compressor.end())
        await response.write_eof()
        return response
    answer = {
        "id": "up-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(WORDS)},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": len(WORDS), "total_tokens": 13},
    }
    data = compressor.piece(json.dumps(answer).encode()) + compressor.end()
    return web.Response(body=data, headers={**headers, "Content-Type": "application/json"})


# --------------------------------------------------------------------------- records


class Records:
    """A SUB socket on every tap: each record's raw payload and its envelope."""

    def __init__(self, context: zmq.asyncio.Context, endpoints: dict[str, str]) -> None:
        self.socket = context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        for topic, endpoint in endpoints.items():
            self.socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
            self.socket.connect(endpoint)
        self.payloads: list[bytes] = []
        self.frames: list[list[bytes]] = []
        self.envelopes: list[dict] = []
        self.heartbeats = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            frames = await self.socket.recv_multipart()
            message = decode_frames(frames)
            if message.topic.endswith(HEARTBEAT_SUFFIX):
                self.heartbeats += 1
                continue
            self.frames.append(frames)
            self.payloads.append(message.payload)
            self.envelopes.append(decode_envelope(message.payload))

    def of(self, request_id: str, tap: str) -> dict | None:
        found = [e for e in self.envelopes if e["request_id"] == request_id and e["tap"] == tap]
        return found[0] if found else None

    async def wait(self, request_id: str, *taps: str) -> dict[str, dict]:
        await wait_until(lambda: all(self.of(request_id, t) for t in taps), timeout=30)
        return {t: self.of(request_id, t) for t in taps}

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.socket.close(linger=0)


class Stack:
    def __init__(self, url: str, frontend: web.Application, records: Records) -> None:
        self.url, self.frontend, self.records = url, frontend, records


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(model_dirs: dict[str, Path]) -> AsyncIterator[Stack]:
    app = web.Application()
    app[SEEN] = []
    app.router.add_post("/v1/chat/completions", chat)
    context = zmq.asyncio.Context()
    endpoints = {
        "plain": f"tcp://127.0.0.1:{reserve_port()}",
        "private": f"tcp://127.0.0.1:{reserve_port()}",
    }
    taps = [
        {
            "name": "plain",
            "topic": "plain",
            "capture": "request_response",
            "endpoint": endpoints["plain"],
            "response": {"text": True},
        },
        {
            "name": "private",
            "topic": "private",
            "capture": "request_response",
            "endpoint": endpoints["private"],
            "filters": ["strip-agent-context"],
            "response": {"text": True},
        },
    ]
    try:
        async with serve(app) as frontend_url:
            config = proxy_config(
                frontend_url,
                models=[{"name": MODEL, "tokenizer": str(model_dirs[MODEL])}],
                taps=taps,
            )
            async with run_proxy(config) as (url, _registry, _app):
                records = Records(context, endpoints)
                try:
                    await wait_until(lambda: records.heartbeats >= 2, timeout=15)
                    yield Stack(url, app, records)
                finally:
                    await records.close()
    finally:
        context.term()


async def post(stack: Stack, body: dict, headers: dict[str, str]) -> tuple[str, int, dict, bytes]:
    request_id = f"fid-{uuid.uuid4().hex[:10]}"
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(
            stack.url + "/v1/chat/completions",
            json=body,
            headers={"x-request-id": request_id, **headers},
        ) as response:
            return request_id, response.status, dict(response.headers), await response.read()


def request_body(**extra: Any) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 9,
        **extra,
    }


# --------------------------------------------------------------------------- tests


@in_module_loop
class TestCompressedResponses:
    """br and zstd responses reach the client unchanged and are read whole by the worker."""

    @pytest.mark.parametrize("encoding", ["br", "zstd"])
    @pytest.mark.parametrize("stream", [True, False])
    async def test_record_complete(self, stack: Stack, encoding: str, stream: bool) -> None:
        body = request_body(stream=stream)
        rid, status, headers, raw = await post(stack, body, {"x-test-encoding": encoding})
        assert status == 200
        assert headers["Content-Encoding"] == encoding
        decoded = (
            brotli.decompress(raw)
            if encoding == "br"
            else zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        )
        assert b"shadow" in decoded  # the client got the frontend's compressed bytes
        record = (await stack.records.wait(rid, "plain"))["plain"]
        response = record["response"]
        assert response["outcome"] == "complete"
        assert response["choices"][0]["finish_reason"] == "stop"
        assert response["choices"][0]["text"] == "".join(WORDS)
        assert response["usage"]["completion_tokens"] == len(WORDS)
        assert response["output_tokens"] == len(WORDS)


ENGINE_HEADERS = {
    "X-Dynamo-Session-Id": "  sess-A ",
    "x-dynamo-parent-session-id": "par-B",
    "x-dynamo-session-final": "true",
    "x-claude-code-session-id": "cc-root",
    "x-codex-foo": "bar",
    "x-dynamo-request-priority": "3",
    "x-dynamo-worker-instance-id": "77",
    "x-tenant-id": " tenant-9 ",
}
SECRET_HEADERS = {
    "Authorization": SECRETS[0],
    "Cookie": SECRETS[1],
    "x-api-key": SECRETS[2],
    "x-codex-api-key": SECRETS[3],
    "x-claude-code-token": SECRETS[4],
    "proxy-authorization": SECRETS[5],
    "x-unlisted": SECRETS[6],
}


@in_module_loop
class TestEngineHeaders:
    """Only allow-listed headers reach the worker, and they fill the record as Dynamo does."""

    async def test_session_routing_and_salt(self, stack: Stack) -> None:
        headers = {"x-test-encoding": "zstd", **ENGINE_HEADERS, **SECRET_HEADERS}
        rid, status, _, _ = await post(stack, request_body(), headers)
        assert status == 200
        found = await stack.records.wait(rid, "plain", "private")
        request = found["plain"]["request"]
        assert request["agent_context"] == {
            "session_id": "sess-A",
            "parent_session_id": "par-B",
            "session_final": True,
            "agent_headers": {"x-claude-code-session-id": ["cc-root"], "x-codex-foo": ["bar"]},
            "input_trigger": "user_message",
        }
        assert request["image_cache_scope"] == "sess-A"
        assert request["routing"]["priority"] == 3
        assert request["routing"]["cache_salt"] == "tenant-9"
        assert "backend_instance_id" not in request["routing"]  # a pin: stripped by default
        assert request["extra_args"]["nvext"]["cache_salt"] == "tenant-9"
        private = found["private"]["request"]
        assert "agent_context" not in private
        assert "image_cache_scope" not in private

    async def test_no_other_header_reaches_any_record_byte(self, stack: Stack) -> None:
        """Many headers, secrets among them; no record byte holds any of them."""
        noise = {f"x-noise-{i}": f"SECRET-noise-{i:04d}" for i in range(40)}
        headers = {"x-test-encoding": "br", **ENGINE_HEADERS, **SECRET_HEADERS, **noise}
        ids = []
        for stream in (False, True):
            rid, status, _, _ = await post(stack, request_body(stream=stream), headers)
            assert status == 200
            ids.append(rid)
        for rid in ids:
            await stack.records.wait(rid, "plain", "private")
        # The frontend did get them (the proxy forwards headers unchanged).
        assert stack.frontend[SEEN][-1]["Authorization"] == SECRETS[0]
        everything = b"".join(b"".join(frames) for frames in stack.records.frames)
        assert b"sess-A" in everything  # the check can see header values in records
        for secret in [*SECRETS, *noise.values()]:
            assert secret.encode() not in everything, secret
        assert b"SECRET" not in everything
