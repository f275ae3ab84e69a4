"""The `shadow-proxy serve` process: graceful SIGTERM, and the openai client through it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import aiohttp
import openai
import pytest
from aiohttp import web

from shadow_proxy.devtools.frontend import MockConfig
from shadow_proxy.devtools.frontend import make_app as mock_app
from shadow_proxy.devtools.processes import (
    Child,
    WaitTimeout,
    cli_argv,
    reserve_port,
    wait_http_ok,
    wait_until,
)
from tests.conftest import proxy_config, run_proxy, serve


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


@pytest.fixture(scope="module")
def deepseek_dir(model_dirs):
    return model_dirs["deepseek"]


class TestOpenAIClient:
    """The real openai client gets the same results through the proxy as directly."""

    async def test_same_results_streaming_and_not(self, deepseek_dir):
        async with serve(mock_app(MockConfig(models={"deepseek": deepseek_dir}))) as upstream:
            async with run_proxy(proxy_config(upstream)) as (url, _, _):
                direct = openai.AsyncOpenAI(base_url=upstream + "/v1", api_key="sk-test")
                through = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test")
                messages = [{"role": "user", "content": "Say hello in two words 😀"}]

                async def unary(client):
                    r = await client.chat.completions.create(
                        model="deepseek", messages=messages, max_tokens=8
                    )
                    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage

                async def streamed(client):
                    stream = await client.chat.completions.create(
                        model="deepseek",
                        messages=messages,
                        max_tokens=8,
                        n=2,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    text, usage = {0: "", 1: ""}, None
                    async for chunk in stream:
                        for choice in chunk.choices:
                            text[choice.index] += choice.delta.content or ""
                        usage = chunk.usage or usage
                    return text, usage

                async def completion(client):
                    r = await client.completions.create(
                        model="deepseek", prompt="Once upon", max_tokens=5
                    )
                    return r.choices[0].text, r.usage

                for call in (unary, streamed, completion):
                    assert await call(through) == await call(direct)
                with pytest.raises(openai.NotFoundError) as through_error:
                    await through.chat.completions.create(
                        model="nope", messages=messages, max_tokens=2
                    )
                with pytest.raises(openai.NotFoundError) as direct_error:
                    await direct.chat.completions.create(
                        model="nope", messages=messages, max_tokens=2
                    )
                assert through_error.value.body == direct_error.value.body
                await direct.close()
                await through.close()


def test_config_error_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nupstream: {url: 'http://x'}\nlisten: {prot: 1}\n")
    result = subprocess.run(
        cli_argv("serve", "--config", str(bad), log_level=None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{bad}:3: 'listen.prot' is not a known key" in result.stderr


async def test_wait_until_fails_on_timeout():
    with pytest.raises(WaitTimeout, match=r"nothing: not within 0\.05 s"):
        await wait_until(lambda: False, timeout=0.05, what="nothing")
