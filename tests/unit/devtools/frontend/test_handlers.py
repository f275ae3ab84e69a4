"""The generation route: faults, pacing, and a client that goes away stopping the generation."""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import Awaitable, Callable

import aiohttp
import openai
import pytest

from shadow_proxy.devtools.processes import wait_until
from tests.support.frontend import HELLO, Server, fault, sse_events, stats_of


class TestFaults:
    """Each fault switch does what a test of the proxy needs it to do."""

    async def test_status(self, client: openai.AsyncOpenAI, server: Server) -> None:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="deepseek", messages=HELLO, stream=True, **fault("status=503")
            )
        assert caught.value.status_code == 503
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["code"] == 503
        assert stats_of(server)["failed"] == 1

    async def test_status_header_before_the_body(
        self, server: Server, http: aiohttp.ClientSession
    ) -> None:
        """A status in the header answers before the body is parsed: even a body
        that is not JSON gets the fault's status, not a 400."""
        headers = {"x-mock-fault": "status=413", "Content-Type": "application/json"}
        async with http.post(
            server[0] + "/v1/chat/completions", data=b"{not json", headers=headers
        ) as resp:
            assert resp.status == 413
        assert stats_of(server)["failed"] == 1

    async def test_fault_in_body_field(self, client: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="deepseek", messages=HELLO, extra_body={"mock_fault": "status=429"}
            )
        assert caught.value.status_code == 429

    async def test_error_event(self, client: openai.AsyncOpenAI, server: Server) -> None:
        stream = await client.chat.completions.create(
            model="deepseek",
            messages=HELLO,
            max_tokens=10,
            stream=True,
            **fault("error-event-after=2"),
        )
        seen = []
        with pytest.raises(openai.APIError, match="worker died"):
            async for chunk in stream:
                seen.append(chunk)
        assert len(seen) == 2
        assert stats_of(server)["failed"] == 1

    async def test_error_event_bytes(self, server: Server, http: aiohttp.ClientSession) -> None:
        body = {"model": "chatml", "messages": HELLO, "max_tokens": 5, "stream": True, "n": 2}
        headers = {"x-mock-fault": "error-event-after=1"}
        async with http.post(
            server[0] + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            events = await sse_events(resp)
        assert len(events) == 3
        assert json.loads(events[-1]) == {
            "error": {"message": "worker died", "type": "internal_error", "code": 500}
        }

    async def test_error_unary(self, client: openai.AsyncOpenAI) -> None:
        with pytest.raises(openai.InternalServerError):
            await client.completions.create(
                model="deepseek", prompt="x", **fault("error-event-after=1")
            )

    async def test_drop(self, server: Server, http: aiohttp.ClientSession) -> None:
        body = {"model": "deepseek", "messages": HELLO, "max_tokens": 10, "stream": True}
        headers = {"x-mock-fault": "drop-after=3"}
        received = b""
        async with http.post(
            server[0] + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for data in resp.content.iter_any():
                    received += data
        assert received.count(b"data: ") == 3
        assert b"[DONE]" not in received
        assert stats_of(server)["failed"] == 1

    async def test_drop_openai(self, client: openai.AsyncOpenAI) -> None:
        stream = await client.completions.create(
            model="deepseek", prompt="x", max_tokens=10, stream=True, **fault("drop-after=2")
        )
        seen = []
        with pytest.raises(openai.APIConnectionError):
            async for chunk in stream:
                seen.append(chunk)
        assert len(seen) == 2

    async def test_gzip_bomb(self, server: Server, http: aiohttp.ClientSession) -> None:
        body = {"model": "deepseek", "messages": HELLO, "stream": True}
        headers = {"x-mock-fault": "gzip-bomb=2", "Accept-Encoding": "gzip"}
        async with http.post(
            server[0] + "/v1/chat/completions", json=body, headers=headers, auto_decompress=False
        ) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
            raw = await resp.read()
        decoded = zlib.decompress(raw, 16 + zlib.MAX_WBITS)
        assert len(raw) * 100 < 2 << 20 <= len(decoded)  # a bomb: 2 MiB from a few KiB
        assert decoded.endswith(b"data: [DONE]\n\n")
        assert decoded.count(b"data: ") == decoded.count(b"\n\n")  # whole events
        assert stats_of(server)["completed"] == 1

    async def test_hang(self, server: Server, http: aiohttp.ClientSession) -> None:
        body = {"model": "deepseek", "messages": HELLO, "stream": True}
        headers = {"x-mock-fault": "hang"}
        async with http.post(
            server[0] + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            assert resp.status == 200
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(resp.content.read(1), 0.3)
            assert stats_of(server)["in_flight"] == 1
        await wait_until(lambda: stats_of(server)["cancelled"] == 1)
        assert stats_of(server)["in_flight"] == 0
        assert stats_of(server)["tokens"] == 0

    async def test_hang_openai_timeout(self, server: Server) -> None:
        async with openai.AsyncOpenAI(
            base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=0.3
        ) as c:
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="deepseek", messages=HELLO, **fault("hang"))
        await wait_until(lambda: stats_of(server)["cancelled"] == 1)

    async def test_unfinished_choice(self, client: openai.AsyncOpenAI, server: Server) -> None:
        stream = await client.chat.completions.create(
            model="deepseek",
            messages=HELLO,
            max_tokens=3,
            n=2,
            stream=True,
            **fault("unfinished-choice=1"),
        )
        finishes: dict[int, list[str | None]] = {0: [], 1: []}
        async for chunk in stream:
            finishes[chunk.choices[0].index].append(chunk.choices[0].finish_reason)
        assert finishes == {0: [None, None, "length"], 1: [None, None, None]}
        assert stats_of(server)["completed"] == 1

    async def test_stop_after(self, client: openai.AsyncOpenAI) -> None:
        reply = await client.chat.completions.create(
            model="deepseek", messages=HELLO, max_tokens=10, n=2, **fault("stop-after=3")
        )
        assert [c.finish_reason for c in reply.choices] == ["stop", "stop"]
        assert reply.choices[0].message.content == "The quick brown"
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 6

    async def test_stop_after_beyond_max_tokens(self, client: openai.AsyncOpenAI) -> None:
        reply = await client.chat.completions.create(
            model="chatml", messages=HELLO, max_tokens=2, **fault("stop-after=5")
        )
        assert reply.choices[0].finish_reason == "length"


class TestCancellation:
    """A client that goes away stops the generation; the stats show it."""

    async def test_stream_disconnect_stops_generation(
        self, start: Callable[..., Awaitable[Server]], http: aiohttp.ClientSession
    ) -> None:
        server = await start(itl_ms=10)
        body = {"model": "deepseek", "messages": HELLO, "max_tokens": 1000, "stream": True}
        async with http.post(server[0] + "/v1/chat/completions", json=body) as resp:
            await resp.content.readuntil(b"\n\n")
            await resp.content.readuntil(b"\n\n")
            resp.close()
        await wait_until(lambda: stats_of(server)["cancelled"] == 1)
        tokens = stats_of(server)["tokens"]
        assert tokens < 100
        assert stats_of(server)["in_flight"] == 0
        # A fence instead of a sleep: another stream at the same pace. While it
        # generates its 10 tokens, a generation still running would have made
        # about as many; only the fence's tokens may be added.
        fence = {**body, "max_tokens": 10}
        async with http.post(server[0] + "/v1/chat/completions", json=fence) as resp:
            await resp.read()
        assert stats_of(server)["completed"] == 1
        assert stats_of(server)["tokens"] == tokens + 10

    async def test_unary_disconnect_stops_generation(
        self, start: Callable[..., Awaitable[Server]]
    ) -> None:
        server = await start(ttft_ms=10, itl_ms=10)
        async with openai.AsyncOpenAI(
            base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=0.2
        ) as c:
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="deepseek", messages=HELLO, max_tokens=500)
        await wait_until(lambda: stats_of(server)["cancelled"] == 1)
        assert stats_of(server)["tokens"] < 100

    async def test_ttft_and_itl(self, start: Callable[..., Awaitable[Server]]) -> None:
        server = await start(ttft_ms=150, itl_ms=30)
        async with openai.AsyncOpenAI(base_url=server[0] + "/v1", api_key="x") as c:
            began = time.monotonic()
            stream = await c.chat.completions.create(
                model="deepseek", messages=HELLO, max_tokens=5, stream=True
            )
            arrivals = [time.monotonic() - began async for _ in stream]
        assert arrivals[0] >= 0.14
        assert arrivals[-1] - arrivals[0] >= 4 * 0.03 - 0.01
