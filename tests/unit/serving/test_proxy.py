"""The pass-through proxy handler against a real aiohttp frontend on loopback."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import socket

import aiohttp
import openai
import pytest

from shadow_proxy.devtools.frontend import MockConfig
from shadow_proxy.devtools.frontend import make_app as mock_app
from shadow_proxy.devtools.processes import reserve_port, wait_until
from tests.support.scripted import SSE_EVENTS, fetch
from tests.support.servers import proxy_config, run_proxy, serve


class TestPassThrough:
    """Status, end-to-end headers and body bytes come back unchanged."""

    async def test_unary_json_equal_direct_and_through(self, frontend, proxy):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            direct = await fetch(s, "GET", frontend.url + "/v1/models")
            through = await fetch(s, "GET", purl + "/v1/models")
        assert through[0] == direct[0] == 200
        assert through[2] == direct[2]
        assert through[1]["Content-Type"] == direct[1]["Content-Type"]

    async def test_sse_bytes_and_streaming(self, frontend, proxy):
        purl, _ = proxy
        body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
        frontend.gate = asyncio.Event()  # the rest waits until the first event arrived
        async with (
            aiohttp.ClientSession() as s,
            s.post(purl + "/v1/chat/completions", data=body) as r,
        ):
            assert r.status == 200
            assert r.headers["Content-Type"] == "text/event-stream"
            assert r.headers["Cache-Control"] == "no-cache"
            # The first event comes alone: the proxy does not wait for the rest.
            first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
            frontend.gate.set()
            rest = await r.read()
        assert first == SSE_EVENTS[0]
        assert first + rest == b"".join(SSE_EVENTS)

    async def test_gzip_body_stays_compressed(self, frontend, proxy):
        purl, _ = proxy
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            direct = await fetch(s, "GET", frontend.url + "/gzip")
            through = await fetch(s, "GET", purl + "/gzip")
        assert through[1]["Content-Encoding"] == "gzip"
        assert through[2] == direct[2]
        assert gzip.decompress(through[2]).startswith(b'{"hello"')

    async def test_large_bodies_both_ways(self, frontend, proxy):
        purl, _ = proxy
        payload = os.urandom(12 * 1024 * 1024)
        async with aiohttp.ClientSession() as s:
            status, headers, body = await fetch(s, "POST", purl + "/echo", data=io.BytesIO(payload))
            big = await fetch(s, "GET", purl + "/big")
        assert status == 200
        assert body == payload
        assert len(big[2]) == 20 * 1024 * 1024

    @pytest.mark.parametrize("code", [400, 401, 404, 422, 429, 500, 503])
    async def test_error_statuses_pass_through(self, frontend, proxy, code):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            direct = await fetch(s, "GET", f"{frontend.url}/status?code={code}")
            through = await fetch(s, "GET", f"{purl}/status?code={code}")
        assert through[0] == direct[0] == code
        assert through[2] == direct[2]

    async def test_any_method_path_and_query(self, frontend, proxy):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
                status, _, _ = await fetch(s, method, purl + "/some/where?x=1&y=%20z")
                assert status == 200
        methods = [(r["method"], r["path"]) for r in frontend.seen]
        assert ("PUT", "/some/where?x=1&y=%20z") in methods
        assert ("DELETE", "/some/where?x=1&y=%20z") in methods


class TestHeaders:
    """Hop-by-hop fields are handled per RFC 9110; request ids flow both ways."""

    async def test_hop_by_hop_removed_both_ways(self, frontend, proxy):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            status, headers, _ = await fetch(
                s,
                "GET",
                purl + "/hop",
                headers={
                    "Connection": "keep-alive, X-Secret-Hop",
                    "X-Secret-Hop": "1",
                    "TE": "trailers",
                    "X-Kept": "yes",
                },
            )
        seen = frontend.seen[-1]["headers"]
        assert "X-Secret-Hop" not in seen
        assert "TE" not in seen
        assert seen["X-Kept"] == "yes"
        assert "X-Private" not in headers
        assert headers["X-Public"] == "2"

    async def test_request_id_generated_and_returned(self, frontend, proxy):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            _, headers, _ = await fetch(s, "GET", purl + "/v1/models")
        rid = headers["x-request-id"]
        assert len(rid) == 32
        assert frontend.seen[-1]["headers"]["x-request-id"] == rid

    async def test_request_id_from_client_kept(self, frontend, proxy):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            _, headers, _ = await fetch(
                s, "GET", purl + "/v1/models", headers={"X-Request-Id": "abc-123"}
            )
        assert headers["x-request-id"] == "abc-123"
        assert frontend.seen[-1]["headers"]["x-request-id"] == "abc-123"

    async def test_custom_request_id_header(self, frontend):
        config = proxy_config(frontend.url, request_id_header="X-Trace")
        async with run_proxy(config) as (purl, _, _), aiohttp.ClientSession() as s:
            _, headers, _ = await fetch(s, "GET", purl + "/v1/models")
        assert headers["x-trace"] == frontend.seen[-1]["headers"]["x-trace"]

    async def test_authorization_forwarded_not_logged(self, frontend, proxy, caplog):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            await fetch(s, "GET", purl + "/v1/models", headers={"Authorization": "Bearer sk-x"})
            await fetch(s, "GET", purl + "/break-before", headers={"Authorization": "Bearer sk-x"})
        assert frontend.seen[-1]["headers"]["Authorization"] == "Bearer sk-x"
        assert "sk-x" not in caplog.text


class TestProxyAnswers:
    """The proxy answers itself only when the frontend cannot, as OpenAI-style JSON."""

    async def test_502_when_unreachable(self):
        config = proxy_config(f"http://127.0.0.1:{reserve_port()}")
        async with run_proxy(config) as (purl, registry, _), aiohttp.ClientSession() as s:
            status, headers, body = await fetch(
                s, "POST", purl + "/v1/chat/completions", data=b"{}"
            )
        assert status == 502
        assert headers["Content-Type"].startswith("application/json")
        assert json.loads(body)["error"]["code"] == 502
        assert (
            registry.get_sample_value("shadow_proxy_upstream_errors_total", {"kind": "connect"})
            == 1
        )

    async def test_504_on_connect_timeout(self):
        listener, fillers = _full_backlog()
        try:
            host, port = listener.getsockname()
            config = proxy_config(f"http://{host}:{port}", upstream={"connect_timeout_s": 0.3})
            async with run_proxy(config) as (purl, registry, _), aiohttp.ClientSession() as s:
                status, _, body = await fetch(s, "GET", purl + "/v1/models")
        finally:
            for f in fillers:
                f.close()
            listener.close()
        assert status == 504
        assert json.loads(body)["error"]["type"] == "upstream_timeout"

    async def test_502_when_frontend_breaks_before_response(self, frontend, proxy):
        purl, _ = proxy
        async with aiohttp.ClientSession() as s:
            status, _, body = await fetch(s, "GET", purl + "/break-before")
            assert status == 502
            assert json.loads(body)["error"]["code"] == 502
            status, _, _ = await fetch(s, "GET", purl + "/v1/models")
            assert status == 200

    async def test_413_above_max_request_bytes(self, frontend):
        config = proxy_config(frontend.url, upstream={"max_request_bytes": 1000})
        async with run_proxy(config) as (purl, _, _):
            async with aiohttp.ClientSession() as s:
                status, _, body = await fetch(s, "POST", purl + "/echo", data=b"x" * 1001)
                assert status == 413
                assert json.loads(body)["error"]["type"] == "request_too_large"

                async def chunked():
                    for _ in range(5):
                        yield b"y" * 400

                status, _, _ = await fetch(s, "POST", purl + "/echo", data=chunked())
                assert status == 413
            async with aiohttp.ClientSession() as s:
                status, _, body = await fetch(s, "POST", purl + "/echo", data=b"x" * 1000)
                assert status == 200
                assert body == b"x" * 1000

    async def test_default_limit_admits_long_prompts(self, frontend, proxy):
        purl, _ = proxy
        payload = b"x" * (8 * 1024 * 1024)
        async with aiohttp.ClientSession() as s:
            status, _, body = await fetch(s, "POST", purl + "/echo", data=io.BytesIO(payload))
        assert status == 200
        assert len(body) == len(payload)

    async def test_break_mid_stream_ends_client_stream_and_proxy_keeps_serving(
        self, frontend, proxy
    ):
        purl, registry = proxy
        async with aiohttp.ClientSession() as s:
            async with s.get(purl + "/break-mid") as r:
                assert r.status == 200
                # The first event reached the client: the proxy has read the
                # frontend's headers, so the reset is a break mid-stream.
                first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
                assert first == SSE_EVENTS[0]
                frontend.break_now.set()
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()
            status, _, _ = await fetch(s, "GET", purl + "/v1/models")
        assert status == 200
        assert (
            registry.get_sample_value("shadow_proxy_upstream_errors_total", {"kind": "broken"}) == 1
        )


class TestDisconnect:
    """A client that hangs up closes the upstream request at once."""

    async def test_the_frontend_is_cancelled_while_it_has_nothing_to_send(self, frontend, proxy):
        """The frontend sends one event and then waits (forever: it is never
        released). Its handler is cancelled while it waits: the proxy closed the
        upstream request because the client left, not because more data came."""
        purl, registry = proxy
        host, port = purl.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /slow-stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        await writer.drain()
        data = b""
        while b"data: first" not in data:
            data += await asyncio.wait_for(reader.read(4096), 5)
        writer.transport.abort()
        await wait_until(lambda: frontend.cancelled, timeout=5)
        assert frontend.cancelled == ["waiting"]
        assert not frontend.release.is_set()
        await wait_until(
            lambda: registry.get_sample_value(
                "shadow_proxy_client_disconnects_total", {"route": "other"}
            )
        )


def _full_backlog() -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose accept queue is full, so a new connect hangs (loopback only)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(8):
        f = socket.socket()
        f.setblocking(False)
        try:
            f.connect(listener.getsockname())
        except BlockingIOError:
            pass
        fillers.append(f)
    return listener, fillers


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
