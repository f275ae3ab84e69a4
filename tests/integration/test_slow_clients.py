"""Slow and numerous clients (issue 18 item 6): a body that does not arrive in
``listen.body_timeout_s`` is answered 408 and counted. (The connection cap:
tests/unit/serving/test_server.py, in-process.)"""

from __future__ import annotations

import asyncio
import time

import pytest

from shadow_proxy.devtools.processes import reserve_port
from tests.integration.harness import (
    Proxy,
    RawFrontend,
    config_text,
    sample,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.solo]

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
            text = config_text(reserve_port(), frontend.url, listen="body_timeout_s: 2")
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
        assert 2.0 <= elapsed < 6.0, elapsed  # at the body timeout, not the reader's 10 s
        assert sample(metrics, "shadow_proxy_body_timeouts_total") == 1
        assert sample(metrics, "shadow_proxy_requests_total", route="chat", status_class="4xx") == 1
        assert frontend.requests == []
        assert b"answered 408 on chat" in proxy.log()
