"""The ``shadow-proxy serve`` process: graceful SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest
from aiohttp import web

from shadow_proxy.devtools.processes import (
    Child,
    cli_argv,
    reserve_port,
    wait_http_ok,
)
from tests.support.servers import serve


def start_serve(tmp_path, upstream: str, grace: float) -> tuple[Child, str]:
    port = reserve_port()
    config = tmp_path / "proxy.yaml"
    config.write_text(
        "schema_version: 1\n"
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        f"upstream: {{url: '{upstream}'}}\n"
        f"shutdown_grace_s: {grace}\n"
    )
    proxy = Child("proxy", cli_argv("serve", "--config", str(config), log_level=None), tmp_path)
    return proxy.start(), f"http://127.0.0.1:{port}"


def slow_frontend(seconds: float) -> web.Application:
    """Streams one event every 100 ms for ``seconds``."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(int(seconds * 10)):
            await response.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(0.1)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/stream", stream)
    return app


class TestSigterm:
    """SIGTERM: stop accepting, let in-flight streams finish within the grace, exit 0."""

    async def test_in_flight_stream_finishes_and_new_connections_refused(self, tmp_path):
        async with serve(slow_frontend(1.5)) as upstream:
            proxy, url = start_serve(tmp_path, upstream, grace=10)
            with proxy:
                await wait_http_ok(url + "/healthz", 30, children=[proxy])
                async with aiohttp.ClientSession() as s, s.get(url + "/stream") as r:
                    first = await r.content.readline()
                    assert first.startswith(b"data: 0")
                    proxy.signal(signal.SIGTERM)
                    body = first + await r.read()
                assert body.rstrip().endswith(b"data: [DONE]")
                with pytest.raises(aiohttp.ClientConnectionError):
                    async with aiohttp.ClientSession() as s2, s2.get(url + "/healthz"):
                        pass
                assert await asyncio.to_thread(proxy.wait, 10) == 0

    async def test_grace_expiry_cuts_the_stream_and_exits_0(self, tmp_path):
        async with serve(slow_frontend(30)) as upstream:
            proxy, url = start_serve(tmp_path, upstream, grace=0.5)
            with proxy:
                await wait_http_ok(url + "/healthz", 30, children=[proxy])
                async with aiohttp.ClientSession() as s, s.get(url + "/stream") as r:
                    await r.content.readline()
                    started = time.monotonic()
                    proxy.signal(signal.SIGTERM)
                    with pytest.raises(aiohttp.ClientPayloadError):
                        await r.read()
                assert await asyncio.to_thread(proxy.wait, 10) == 0
                assert time.monotonic() - started < 5
