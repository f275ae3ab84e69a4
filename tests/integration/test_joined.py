"""Issue 5 end to end: joined records through the real proxy, tap worker and SUB
socket, with the mock frontend behind and real clients in front.

One proxy (two joined taps with different response options) serves the module;
each tap is read by a real SUB socket that collects every record and the latest
heartbeat. Every request carries its own ``x-request-id``, so each test reads
exactly its own records, and the last test checks that across the module no
request reached a tap twice and no ``seq`` was skipped.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import openai
import pytest
import pytest_asyncio
from aiohttp import web

from shadow_proxy.devtools.frontend import (
    STATS_KEY,
    MockConfig,
    ServedModel,
    load_models,
    serve_mock_frontend,
)
from shadow_proxy.devtools.processes import reserve_endpoint, wait_until
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.request.tokenizer import LoadedModel, load_model
from shadow_proxy.worker.response.recorder import ResponseRecorder
from tests.support.servers import proxy_config, run_proxy
from tests.support.subscriber import TapSubscriber

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

MODEL = "deepseek"
MESSAGES = [{"role": "user", "content": "Tell me about foxes."}]
PROMPT = "Once upon a time, a fox"
ITL_MS = 5.0
#: The proxy's upstream read timeout: short, for the hang test; far above ITL_MS.
READ_TIMEOUT_S = 1.0
#: The lean tap's ``response.max_tokens``.
LEAN_MAX_TOKENS = 3
RECORD_WAIT_S = 10.0


# --------------------------------------------------------------------------- readers


async def expect(reader: TapSubscriber, *request_ids: str) -> dict[str, dict[str, Any]]:
    """Wait until each request has its record on ``reader``; exactly one each.
    Returns each request's ``response`` map."""
    await reader.wait_requests(request_ids, RECORD_WAIT_S)
    found = {i: reader.of(i) for i in request_ids}
    assert {i: len(r) for i, r in found.items()} == dict.fromkeys(request_ids, 1)
    return {i: r[0]["response"] for i, r in found.items()}


@attrs.define
class Stack:
    """The mock frontend, the proxy in front of it, and a reader per tap."""

    url: str
    frontend: web.Application
    full: TapSubscriber
    lean: TapSubscriber
    model: LoadedModel
    client: openai.AsyncOpenAI
    session: aiohttp.ClientSession

    def readers(self) -> tuple[TapSubscriber, TapSubscriber]:
        return self.full, self.lean

    def decode(self, ids: list[int]) -> str:
        return self.model.backend.decode(ids)

    async def records(self, *request_ids: str) -> list[tuple[dict, dict]]:
        """Per request, its record on the full tap and on the lean tap."""
        full = await expect(self.full, *request_ids)
        lean = await expect(self.lean, *request_ids)
        return [(full[i], lean[i]) for i in request_ids]


def new_id(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:12]}"


def headers(request_id: str, fault: str | None = None) -> dict[str, str]:
    found = {"x-request-id": request_id}
    if fault:
        found["x-mock-fault"] = fault
    return found


def tap(name: str, endpoint: str, **response: Any) -> dict[str, Any]:
    return {
        "name": name,
        "capture": "request_response",
        "endpoint": endpoint,
        "response": response,
    }


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def served(model_dirs: dict[str, Path]) -> dict[str, ServedModel]:
    return load_models(MockConfig(models={MODEL: model_dirs[MODEL]}))


@pytest.fixture(scope="module")
def loaded(model_dirs: dict[str, Path]) -> LoadedModel:
    """The tokenizer as the worker loads it, to decode and to feed a recorder."""
    return load_model(MODEL, str(model_dirs[MODEL]))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def frontend(
    model_dirs: dict[str, Path], served: dict[str, ServedModel]
) -> AsyncIterator[tuple[str, web.Application]]:
    config = MockConfig(models={MODEL: model_dirs[MODEL]}, itl_ms=ITL_MS)
    async with serve_mock_frontend(config, served) as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    frontend: tuple[str, web.Application],
    model_dirs: dict[str, Path],
    loaded: LoadedModel,
) -> AsyncIterator[Stack]:
    """The proxy with two joined taps: ``full`` (ids, text, chunk timing) and
    ``lean`` (ids capped at ``LEAN_MAX_TOKENS``, no text, no timing)."""
    full_at = reserve_endpoint()
    lean_at = reserve_endpoint()
    config = proxy_config(
        frontend[0],
        upstream={"read_timeout_s": READ_TIMEOUT_S},
        models={MODEL: model_dirs[MODEL]},
        taps=[
            tap("full", full_at, text=True, chunk_timing=True),
            tap("lean", lean_at, max_tokens=LEAN_MAX_TOKENS),
        ],
    )
    async with run_proxy(config) as (url, _registry, _app):
        full = TapSubscriber(full_at, "shadow-requests-full")
        lean = TapSubscriber(lean_at, "shadow-requests-lean")
        client = openai.AsyncOpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20
        )
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))
        try:
            await full.wait_heartbeats()
            await lean.wait_heartbeats()
            yield Stack(url, frontend[1], full, lean, loaded, client, session)
        finally:
            await session.close()
            await client.close()
            full.close()
            lean.close()


# --------------------------------------------------------------------------- checks


def check_offsets(response: dict[str, Any]) -> None:
    first = response["first_token_offset_ns"]
    last = response["last_token_offset_ns"]
    # The serving loop's stamp: the request went to the frontend after it arrived
    # and before anything came back (a record's latencies start there).
    sent = response["upstream_sent_offset_ns"]
    assert 0 < sent < first <= last <= response["end_offset_ns"]
    offsets = response.get("chunk_offsets_ns", [])
    assert offsets == sorted(offsets)
    if offsets:
        assert offsets[0] == first
        assert offsets[-1] == last


def check_complete(
    stack: Stack,
    full: dict[str, Any],
    lean: dict[str, Any],
    *,
    texts: list[str],
    upstream_id: str,
    output_tokens: int,
    content_chunks: int,
    usage: dict[str, Any] | None,
) -> None:
    """A ``complete`` record on both taps, checked against what the client saw."""
    for response in (full, lean):
        assert response["outcome"] == "complete"
        assert response["http_status"] == 200
        assert response["upstream_id"] == upstream_id
        assert response["output_tokens"] == output_tokens
        assert response["token_ids_source"] == "retokenized"
        assert "error" not in response
        assert [c["index"] for c in response["choices"]] == list(range(len(texts)))
        assert all(c["finish_reason"] == "length" for c in response["choices"])
        if usage is None:
            assert "usage" not in response
        else:
            assert response["usage"] == usage
        check_offsets(response)
    # The full tap: every id, the text, a chunk offset per content chunk.
    for choice, text in zip(full["choices"], texts, strict=True):
        assert stack.decode(choice["token_ids"]) == text
        assert choice["text"] == text
        assert "truncated" not in choice
    assert len(full["chunk_offsets_ns"]) == content_chunks
    # The lean tap: the same tokenization, cut at its cap; no text, no timing.
    assert "chunk_offsets_ns" not in lean
    for f, c in zip(full["choices"], lean["choices"], strict=True):
        assert "text" not in c
        assert c["output_tokens"] == f["output_tokens"]
        assert c["token_ids"] == f["token_ids"][:LEAN_MAX_TOKENS]
        assert c.get("truncated", False) == (len(f["token_ids"]) > LEAN_MAX_TOKENS)


def sse_data(body: bytes) -> list[Any]:
    """The JSON payloads of an SSE body (``[DONE]`` left out)."""
    found = []
    for event in body.split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                found.append(json.loads(line[6:]))
    return found


async def read_events(response: aiohttp.ClientResponse, count: int) -> bytes:
    """Read until ``count`` SSE events have arrived; returns the bytes read."""
    seen = b""
    while seen.count(b"\n\n") < count:
        chunk = await response.content.readany()
        assert chunk, "the stream ended early"
        seen += chunk
    return seen


# --------------------------------------------------------------------------- tests


class TestComplete:
    """A clean end with every choice finished is ``complete``, and the record
    matches what the client saw."""

    async def test_chat_stream_with_usage(self, stack: Stack):
        rid = new_id("chat-usage")
        stream = await stack.client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers(rid),
        )
        pieces, ids, usage, chunks = [], set(), None, 0
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.usage is not None:
                usage = chunk.usage.model_dump(exclude_none=True)
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                chunks += 1
        assert usage is not None and len(ids) == 1
        [(full, lean)] = await stack.records(rid)
        check_complete(
            stack,
            full,
            lean,
            texts=["".join(pieces)],
            upstream_id=ids.pop(),
            output_tokens=usage["completion_tokens"],
            content_chunks=chunks,
            usage=usage,
        )

    async def test_chat_stream_without_usage(self, stack: Stack):
        """Without usage the count is the retokenized text: one token per chunk
        here, as the mock sends them."""
        rid = new_id("chat-nousage")
        stream = await stack.client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=7, stream=True, extra_headers=headers(rid)
        )
        pieces, ids = [], set()
        async for chunk in stream:
            ids.add(chunk.id)
            assert chunk.usage is None
            if chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        [(full, lean)] = await stack.records(rid)
        check_complete(
            stack,
            full,
            lean,
            texts=["".join(pieces)],
            upstream_id=ids.pop(),
            output_tokens=len(pieces),
            content_chunks=len(pieces),
            usage=None,
        )

    async def test_chat_unary(self, stack: Stack):
        rid = new_id("chat-unary")
        answer = await stack.client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=9, extra_headers=headers(rid)
        )
        usage = answer.usage.model_dump(exclude_none=True)
        [(full, lean)] = await stack.records(rid)
        check_complete(
            stack,
            full,
            lean,
            texts=[answer.choices[0].message.content],
            upstream_id=answer.id,
            output_tokens=usage["completion_tokens"],
            content_chunks=1,
            usage=usage,
        )

    async def test_completions_stream(self, stack: Stack):
        rid = new_id("cmpl-stream")
        stream = await stack.client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers(rid),
        )
        pieces, ids, usage = [], set(), None
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.usage is not None:
                usage = chunk.usage.model_dump(exclude_none=True)
            if chunk.choices and chunk.choices[0].text:
                pieces.append(chunk.choices[0].text)
        assert usage is not None
        [(full, lean)] = await stack.records(rid)
        check_complete(
            stack,
            full,
            lean,
            texts=["".join(pieces)],
            upstream_id=ids.pop(),
            output_tokens=usage["completion_tokens"],
            content_chunks=len(pieces),
            usage=usage,
        )

    async def test_completions_unary(self, stack: Stack):
        rid = new_id("cmpl-unary")
        answer = await stack.client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=5, extra_headers=headers(rid)
        )
        usage = answer.usage.model_dump(exclude_none=True)
        [(full, lean)] = await stack.records(rid)
        check_complete(
            stack,
            full,
            lean,
            texts=[answer.choices[0].text],
            upstream_id=answer.id,
            output_tokens=usage["completion_tokens"],
            content_chunks=1,
            usage=usage,
        )

    async def test_two_choices_complete(self, stack: Stack):
        rid = new_id("n2")
        stream = await stack.client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=6,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers(rid),
        )
        pieces: dict[int, list[str]] = {0: [], 1: []}
        ids, usage, chunks = set(), None, 0
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.usage is not None:
                usage = chunk.usage.model_dump(exclude_none=True)
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces[choice.index].append(choice.delta.content)
                    chunks += 1
        assert usage is not None and usage["completion_tokens"] == 12
        [(full, lean)] = await stack.records(rid)
        check_complete(
            stack,
            full,
            lean,
            texts=["".join(pieces[0]), "".join(pieces[1])],
            upstream_id=ids.pop(),
            output_tokens=12,
            content_chunks=chunks,
            usage=usage,
        )
        assert [c["output_tokens"] for c in full["choices"]] == [6, 6]


class TestIncomplete:
    """A clean end with a requested choice left unfinished is ``incomplete``."""

    async def test_two_choices_one_unfinished(self, stack: Stack):
        rid = new_id("n2-unfinished")
        stream = await stack.client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=5,
            n=2,
            stream=True,
            extra_headers=headers(rid, "unfinished-choice=1"),
        )
        reasons = {}
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.finish_reason is not None:
                    reasons[choice.index] = choice.finish_reason
        assert reasons == {0: "length"}
        [(full, lean)] = await stack.records(rid)
        for response in (full, lean):
            assert response["outcome"] == "incomplete"
            assert response["http_status"] == 200
            assert "error" not in response
            assert response["choices"][0]["finish_reason"] == "length"
            assert "finish_reason" not in response["choices"][1]
            assert response["output_tokens"] == 10


class TestCancelled:
    """A client that hangs up first gets ``cancelled``, with what arrived kept."""

    async def test_disconnect_mid_stream(self, stack: Stack):
        rid = new_id("cancel")
        stats = stack.frontend[STATS_KEY]
        cancelled_before = stats.requests_cancelled
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 400, "stream": True}
        async with stack.session.post(
            stack.url + "/v1/chat/completions", json=body, headers=headers(rid)
        ) as response:
            assert response.status == 200
            seen = await read_events(response, 4)
            response.close()  # hang up mid-stream
        [(full, lean)] = await stack.records(rid)
        arrived = [e for e in sse_data(seen) if e["choices"][0]["delta"].get("content")]
        for response in (full, lean):
            assert response["outcome"] == "cancelled"
            assert "error" not in response
            assert len(arrived) <= response["output_tokens"] < 400
            assert "finish_reason" not in response["choices"][0]
            check_offsets(response)
        assert full["choices"][0]["text"].startswith(
            "".join(e["choices"][0]["delta"]["content"] for e in arrived)
        )
        # The frontend stopped generating too.
        await wait_until(lambda: stats.requests_cancelled > cancelled_before)


class TestErrors:
    """An error status, an error event, a broken connection or a timeout is
    ``error``, with the status and the message."""

    @pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
    @pytest.mark.parametrize("status", [500, 503])
    async def test_error_status(self, stack: Stack, status: int, stream: bool):
        rid = new_id(f"status-{status}")
        with pytest.raises(openai.APIStatusError) as raised:
            await stack.client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=5,
                stream=stream,
                extra_headers=headers(rid, f"status={status}"),
            )
        assert raised.value.status_code == status
        [(full, lean)] = await stack.records(rid)
        for response in (full, lean):
            assert response["outcome"] == "error"
            assert response["http_status"] == status
            assert response["error"] == f"mock fault: status {status}"
            assert response["choices"] == []
            assert response["output_tokens"] == 0

    async def test_stream_breaks(self, stack: Stack):
        """The client sees a broken stream, the record keeps the tokens that
        came, and the proxy goes on serving."""
        rid = new_id("drop")
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, "stream": True}
        url = stack.url + "/v1/chat/completions"
        with pytest.raises(aiohttp.ClientPayloadError):
            async with stack.session.post(
                url, json=body, headers=headers(rid, "drop-after=4")
            ) as r:
                assert r.status == 200
                await r.read()
        [(full, lean)] = await stack.records(rid)
        for response in (full, lean):
            assert response["outcome"] == "error"
            assert response["http_status"] == 200
            assert response["error"] == "connection to the frontend broke"
            assert response["output_tokens"] == 4
        assert full["choices"][0]["text"] == stack.decode(full["choices"][0]["token_ids"])
        after = new_id("after-drop")
        async with stack.session.post(url, json=body, headers=headers(after)) as r:
            assert r.status == 200
            await r.read()
        [(full, _)] = await stack.records(after)
        assert full["outcome"] == "complete"

    async def test_error_event(self, stack: Stack):
        """(Raw aiohttp: the ``openai`` client no longer raises on an error chunk
        in a chat stream, so it cannot show what the client saw.)"""
        rid = new_id("error-event")
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "stream": True}
        url = stack.url + "/v1/chat/completions"
        fault = headers(rid, "error-event-after=3")
        async with stack.session.post(url, json=body, headers=fault) as r:
            assert r.status == 200
            events = sse_data(await r.read())
        assert events[-1]["error"]["message"] == "worker died"
        pieces = [e["choices"][0]["delta"]["content"] for e in events[:-1]]
        assert len(pieces) == 3
        [(full, lean)] = await stack.records(rid)
        for response in (full, lean):
            assert response["outcome"] == "error"
            assert response["http_status"] == 200
            assert response["error"] == "worker died"
            assert response["output_tokens"] == 3
        assert full["choices"][0]["text"] == "".join(pieces)

    async def test_stream_hangs_until_read_timeout(self, stack: Stack):
        """Headers, then silence: after ``read_timeout_s`` the client's stream
        ends broken and the record says why."""
        rid = new_id("hang-stream")
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "stream": True}
        url = stack.url + "/v1/chat/completions"
        started = asyncio.get_running_loop().time()
        with pytest.raises(aiohttp.ClientPayloadError):
            async with stack.session.post(url, json=body, headers=headers(rid, "hang")) as r:
                assert r.status == 200
                await r.read()
        assert asyncio.get_running_loop().time() - started >= READ_TIMEOUT_S * 0.9
        [(full, lean)] = await stack.records(rid)
        for response in (full, lean):
            assert response["outcome"] == "error"
            assert response["http_status"] == 200
            assert response["error"] == "read timeout"
            assert response["choices"] == []
            assert "first_token_offset_ns" not in response
            assert response["end_offset_ns"] >= READ_TIMEOUT_S * 0.9e9

    async def test_unary_hangs_until_read_timeout(self, stack: Stack):
        """No headers at all: the proxy answers 504 itself; the record is an error."""
        rid = new_id("hang-unary")
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 5}
        url = stack.url + "/v1/chat/completions"
        async with stack.session.post(url, json=body, headers=headers(rid, "hang")) as r:
            assert r.status == 504
            await r.read()
        [(full, lean)] = await stack.records(rid)
        for response in (full, lean):
            assert response["outcome"] == "error"
            assert response["http_status"] == 504  # the proxy's own answer
            assert "timeout" in response["error"] or "504" in response["error"]
            assert response["choices"] == []


class TestTruncation:
    """``response.max_tokens`` caps the ids kept, never the count."""

    async def test_max_tokens_caps_ids_not_count(self, stack: Stack):
        rid = new_id("cap")
        answer = await stack.client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=10, extra_headers=headers(rid)
        )
        assert answer.usage.completion_tokens == 10
        [(full, lean)] = await stack.records(rid)
        [choice] = lean["choices"]
        assert len(choice["token_ids"]) == LEAN_MAX_TOKENS
        assert choice["truncated"] is True
        assert choice["output_tokens"] == lean["output_tokens"] == 10
        assert len(full["choices"][0]["token_ids"]) == 10
        assert "truncated" not in full["choices"][0]


class TestCancellationRun:
    """40 concurrent streams, a chosen 10 abandoned mid-stream: exactly those
    are ``cancelled``, the rest ``complete``, and the taps' counters agree."""

    async def test_quarter_cancelled(self, stack: Stack):
        ids = [new_id(f"run{i:02d}") for i in range(40)]
        chosen = set(ids[::4])
        before = [len(reader.records) for reader in stack.readers()]

        async def one(rid: str) -> None:
            cancel = rid in chosen
            stream = await stack.client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=300 if cancel else 10,
                stream=True,
                extra_headers=headers(rid),
            )
            content = 0
            async with stream:
                async for chunk in stream:
                    content += bool(chunk.choices[0].delta.content)
                    if cancel and content == 3:
                        break  # leaving the block closes the connection

        await asyncio.gather(*(one(rid) for rid in ids))
        records = await stack.records(*ids)
        for rid, (full, lean) in zip(ids, records, strict=True):
            expected = "cancelled" if rid in chosen else "complete"
            assert (rid, full["outcome"], lean["outcome"]) == (rid, expected, expected)
            assert full["output_tokens"] >= 3
        for reader, count in zip(stack.readers(), before, strict=True):
            assert len(reader.records) == count + 40
            beat = await reader.wait_settled(RECORD_WAIT_S)
            assert beat.next_seq == beat.queued == beat.published == len(reader.records)
            assert not beat.dropped and beat.publish_errors == 0


class TestSplitInvariance:
    """The record the worker builds from the proxy's chunks equals one built
    from the client's chunks (other read boundaries) fed to a recorder here."""

    async def test_same_record_from_client_chunks(self, stack: Stack):
        rid = new_id("split")
        body = {
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": 15,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        recorder = ResponseRecorder(Route.CHAT, 1, chunk_timing=True)
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with stack.session.post(
            stack.url + "/v1/chat/completions", json=body, headers=headers(rid)
        ) as r:
            recorder.head(r.status, r.headers["Content-Type"], "", 0)
            async for chunk in r.content.iter_any():
                recorder.feed(chunk, int((loop.time() - started) * 1e9))
        observed = recorder.finish(EndKind.CLEAN, int((loop.time() - started) * 1e9))
        mine = observed.to_record(
            stack.model.encode, tokens=True, text=True, max_tokens=None, chunk_timing=False
        )
        [(full, _)] = await stack.records(rid)
        timing = (
            "first_token_offset_ns",
            "last_token_offset_ns",
            "end_offset_ns",
            "upstream_sent_offset_ns",
        )
        theirs = {k: v for k, v in full.items() if k not in (*timing, "chunk_offsets_ns")}
        assert {k: v for k, v in mine.items() if k not in timing} == theirs
        assert len(observed.chunk_offsets_ns) == len(full["chunk_offsets_ns"]) == 15


class TestShutdown:
    """A stream still open when the proxy stops still gets its one record."""

    async def test_shutdown_mid_stream(
        self,
        frontend: tuple[str, web.Application],
        model_dirs: dict[str, Path],
    ):
        endpoint = reserve_endpoint()
        config = proxy_config(
            frontend[0],
            models={MODEL: model_dirs[MODEL]},
            taps=[tap("stop", endpoint)],
            # The proxy waits the configured grace (issue 17), not the runner's timeout.
            shutdown_grace_s=1,
        )
        rid = new_id("shutdown")
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2000, "stream": True}
        reader = TapSubscriber(endpoint, "shadow-requests-stop")
        try:
            async with aiohttp.ClientSession() as session:
                async with run_proxy(config) as (url, _, _):
                    await reader.wait_heartbeats()
                    response = await session.post(
                        url + "/v1/chat/completions", json=body, headers=headers(rid)
                    )
                    assert response.status == 200
                    await read_events(response, 3)
                # The runner is gone: the grace period (1 s) passed, the handler
                # was cancelled, the worker finished and drained.
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()
                response.release()
            [record] = (await expect(reader, rid)).values()
            assert record["outcome"] == "error"
            assert record["error"] == "proxy shut down"
            assert record["http_status"] == 200
            assert 3 <= record["output_tokens"] < 2000
            check_offsets(record)
            beat = await reader.wait_settled(RECORD_WAIT_S)
            assert beat.next_seq == beat.published == 1
            assert [r["seq"] for r in reader.records] == [0]
        finally:
            reader.close()


class TestExactlyOnce:
    """Across the module: no request reached a tap twice, no ``seq`` skipped.
    (Runs last: it reads what the tests above left on the shared taps.)"""

    async def test_each_request_once_per_tap(self, stack: Stack):
        # A few more exchanges of each ending, so that this test checks
        # something when run alone.
        url = stack.url + "/v1/chat/completions"
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 300, "stream": True}
        ids = [new_id("once-complete"), new_id("once-error"), new_id("once-cancel")]
        async with stack.session.post(
            url, json={**body, "max_tokens": 4}, headers=headers(ids[0])
        ) as r:
            await r.read()
        async with stack.session.post(url, json=body, headers=headers(ids[1], "status=500")) as r:
            await r.read()
        async with stack.session.post(url, json=body, headers=headers(ids[2])) as r:
            await read_events(r, 2)
            r.close()
        records = await stack.records(*ids)
        outcomes = [(full["outcome"], lean["outcome"]) for full, lean in records]
        assert outcomes == [("complete",) * 2, ("error",) * 2, ("cancelled",) * 2]
        for reader in stack.readers():
            beat = await reader.wait_settled(RECORD_WAIT_S)
            seqs = [r["seq"] for r in reader.records]
            assert seqs == list(range(len(seqs)))
            assert beat.next_seq == len(seqs)
            request_ids = [r["request_id"] for r in reader.records]
            assert len(set(request_ids)) == len(request_ids)
        assert [r["request_id"] for r in stack.full.records] == [
            r["request_id"] for r in stack.lean.records
        ]
