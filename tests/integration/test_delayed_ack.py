"""A frontend that writes without TCP_NODELAY (as Dynamo 1.6.1's HTTP listener
does) costs a client nothing through the proxy's pooled connections.

The frontend here is a real aiohttp server that turns Nagle back on for its
connection and sends the response headers and the first body bytes as two
writes. On a kept-alive connection the second write waits for the headers'
acknowledgement, which Linux delays by 40 ms or more; a client on a fresh
connection never waits. The proxy keeps its connections to the frontend alive,
so without ``sockets.ack_now`` every client, even one that connects afresh for
each request, would wait (measured on Dynamo 1.6.1: first token 49 ms through
the proxy, 15 ms direct). The stall is tens of milliseconds against well under
one, so the comparison below is of medians within one run, with a wide
margin, not a timing target; the control proves the stall is there to remove.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from shadow_proxy.devtools.loadgen import first_bytes_ms
from shadow_proxy.replay.client import CandidateClient
from shadow_proxy.replay.request import CandidateRequest
from tests.support.servers import proxy_config, run_proxy, serve

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="delayed ACK and TCP_QUICKACK as Linux has them"
)

REQUESTS = 9
#: The stall is at least Linux's minimum delayed-ACK timeout (40 ms); a first
#: chunk that is not held back arrives within a few milliseconds.
STALL_MS = 30.0
CHUNK = b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
LAST = b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'


async def nagle_frontend(request: web.Request) -> web.StreamResponse:
    """Headers, then the first chunk as a second write, with Nagle on."""
    await request.read()
    assert request.transport is not None
    sock = request.transport.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)  # a StreamResponse sends its headers at once
    await asyncio.sleep(0.002)
    await response.write(CHUNK)
    await asyncio.sleep(0.01)
    await response.write(LAST)
    await response.write_eof()
    return response


@pytest.fixture
async def frontend() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/completions", nagle_frontend)
    async with serve(app) as url:
        yield url


BODY = {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": True}


async def first_chunk_ms(url: str, *, fresh: bool) -> float:
    """Median time to the first body bytes over ``REQUESTS`` requests, on one
    kept-alive connection or on a fresh connection each."""
    times = await first_bytes_ms(url + "/v1/completions", [BODY] * REQUESTS, fresh=fresh)
    assert len(times) == REQUESTS
    return statistics.median(times)


async def test_the_frontend_stalls_kept_alive_connections(frontend: str) -> None:
    """The control: without a quick ACK the frontend's first chunk waits."""
    kept_alive = await first_chunk_ms(frontend, fresh=False)
    fresh = await first_chunk_ms(frontend, fresh=True)
    assert kept_alive > STALL_MS > fresh, (kept_alive, fresh)


async def test_proxy_adds_no_stall(frontend: str) -> None:
    """A client connecting afresh each time waits no longer through the proxy
    (whose connection to the frontend is kept alive) than directly."""
    async with run_proxy(proxy_config(frontend)) as (url, _registry, _app):
        await first_chunk_ms(url, fresh=True)  # the proxy's connection is now kept alive
        through_proxy = await first_chunk_ms(url, fresh=True)
        kept_alive = await first_chunk_ms(url, fresh=False)
    assert through_proxy < STALL_MS, through_proxy
    assert kept_alive < STALL_MS, kept_alive


async def test_switched_off(frontend: str) -> None:
    """``upstream.quick_ack: false`` leaves the kernel's delayed ACK alone: the
    stall is back for a client connecting afresh."""
    config = proxy_config(frontend, upstream={"quick_ack": False})
    async with run_proxy(config) as (url, _registry, _app):
        await first_chunk_ms(url, fresh=True)
        through_proxy = await first_chunk_ms(url, fresh=True)
    assert through_proxy > STALL_MS, through_proxy


async def test_replay_measures_no_stall(frontend: str) -> None:
    """The replayer keeps its connections alive too; its TTFT is the frontend's."""
    request = CandidateRequest(request_id="r", body=BODY, prompt_tokens=1)
    async with CandidateClient(frontend, concurrency=1) as client:
        ttfts = []
        for _ in range(REQUESTS):
            observation = await client.send(request)
            assert observation.ttft_ms is not None, observation
            ttfts.append(observation.ttft_ms)
            await asyncio.sleep(0.01)
    assert statistics.median(ttfts) < STALL_MS, ttfts
