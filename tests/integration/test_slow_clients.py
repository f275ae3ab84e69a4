"""Slow and numerous clients (issue 18 item 6): a body that does not arrive in
``listen.body_timeout_s`` is answered 408 and counted; past
``listen.max_connections`` a connection is answered 503 and closed, counted and
logged once, and a place frees when a connection closes."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from tests.integration.harness import (
    Proxy,
    RawFrontend,
    config_text,
    new_port,
    raw_exchange,
    sample,
)

pytestmark = pytest.mark.timeout(120)

HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)


async def read_response_head(reader: asyncio.StreamReader, timeout: float) -> bytes:
    async with asyncio.timeout(timeout):
        return await reader.readuntil(b"\r\n\r\n")


class TestBodyTimeout:
    """Headers with a Content-Length, then silence or a trickle: 408 at the timeout."""

    @pytest.mark.parametrize("trickle", [False, True])
    async def test_408_at_the_timeout(self, tmp_path, trickle):
        async with RawFrontend() as frontend:
            text = config_text(new_port(), frontend.url, listen="body_timeout_s: 2")
            proxy = Proxy(tmp_path, text).start()
            try:
                await proxy.wait_ready()
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                started = time.monotonic()
                writer.write(HEAD)

                async def dribble() -> None:  # one byte every 0.5 s: never 100 in time
                    while trickle:
                        await asyncio.sleep(0.5)
                        writer.write(b"x")

                dribbler = asyncio.create_task(dribble())
                try:
                    head = await read_response_head(reader, 10)
                finally:
                    dribbler.cancel()
                    writer.close()
                elapsed = time.monotonic() - started
                metrics = await proxy.metrics()
            finally:
                assert proxy.stop() == 0
        assert head.startswith(b"HTTP/1.1 408"), head
        assert 2.0 <= elapsed < 3.5, elapsed
        assert sample(metrics, "shadow_proxy_body_timeouts_total") == 1
        assert sample(metrics, "shadow_proxy_requests_total", route="chat", status_class="4xx") == 1
        assert frontend.requests == []
        assert b"answered 408 on chat" in proxy.log()


class TestConnectionCap:
    """At most ``listen.max_connections`` client connections at once."""

    async def test_the_next_connection_gets_503_and_a_place_frees(self, tmp_path):
        async with RawFrontend() as frontend:
            text = config_text(new_port(), frontend.url, listen="max_connections: 5")
            proxy = Proxy(tmp_path, text).start()
            held: list[asyncio.StreamWriter] = []
            try:
                await proxy.wait_ready()
                for _ in range(5):
                    held.append((await asyncio.open_connection("127.0.0.1", proxy.port))[1])
                await asyncio.sleep(0.2)  # the server has accepted them
                refused = []
                for _ in range(3):
                    refused.append(
                        await raw_exchange(
                            proxy.port, b"GET /v1/models HTTP/1.1\r\nHost: p\r\n\r\n", timeout=5
                        )
                    )
                # One closes: a new client is served.
                held.pop().close()
                deadline = time.monotonic() + 5
                while True:
                    served = await raw_exchange(
                        proxy.port,
                        b"GET /v1/models HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n",
                        timeout=5,
                    )
                    if served.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                # /metrics needs a place too: free one more.
                held.pop().close()
                await asyncio.sleep(0.2)
                metrics = await proxy.metrics()
            finally:
                for writer in held:
                    writer.close()
                with contextlib.suppress(Exception):
                    assert proxy.stop() == 0
        for answer in refused:
            assert answer.startswith(b"HTTP/1.1 503"), answer[:100]
            assert b"too_many_connections" in answer
        assert served.startswith(b"HTTP/1.1 200"), served[:100]
        assert sample(metrics, "shadow_proxy_connections_refused_total") >= 3
        # The connections open when /metrics was read: 3 held and its own.
        assert sample(metrics, "shadow_proxy_client_connections") == 4
        log = proxy.log().decode()
        assert log.count("listen.max_connections (5) reached") == 1, log
