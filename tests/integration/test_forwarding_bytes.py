"""The rule: the request target and body are forwarded byte for byte (issue 17
items 1 and 11, issue 18 items 7 and 8; docs/design.md "Design rules").

The real ``shadow-proxy serve`` process between a raw-socket client and a
raw-socket frontend that records exactly what reached it.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib

import pytest

from shadow_proxy.devtools.processes import reserve_port, wait_until
from tests.integration.harness import (
    Proxy,
    RawFrontend,
    config_text,
    raw_exchange,
    raw_response,
    sample,
)

pytestmark = pytest.mark.timeout(120)

#: Targets a client may send and aiohttp's parser accepts; each must reach the
#: frontend as written (no dot-segment removal, no re-quoting, no case change).
ODD_TARGETS = [
    b"/v1/models/../../etc/passwd?q=%ff",
    b"/v1/chat/completions/./x/..//y?a=%2F%2f&b=%zz%",
    b"//double//slashes?x=1&&y=",
    b"/a%00b%0d%0a%25?%00",
    b"/%2e%2e/%2E%2E/v1/models",
    b'/search?q="quoted"&p=[1]{2}|\\^`',
    b"/a'b!$&()*+,;=:@~?k=v;w",
    b"/v1/models?" + b"x" * 6000,
]


def get(target: bytes, *extra: bytes) -> bytes:
    return (
        b"GET "
        + target
        + b" HTTP/1.1\r\nHost: client.example\r\n"
        + b"".join(extra)
        + (b"Connection: close\r\n\r\n")
    )


def post(target: bytes, body: bytes, *headers: bytes) -> bytes:
    head = b"POST " + target + b" HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
    head += b"".join(h + b"\r\n" for h in headers)
    return head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body


@pytest.fixture
async def proxied(tmp_path):
    """A raw frontend and the proxy in front of it (no taps)."""
    async with RawFrontend() as frontend:
        proxy = Proxy(tmp_path, config_text(reserve_port(), frontend.url)).start()
        try:
            await proxy.wait_ready()
            yield proxy, frontend
        finally:
            assert proxy.stop() == 0


class TestTargets:
    """The request target reaches the frontend as the client wrote it."""

    async def test_odd_targets_byte_for_byte(self, proxied):
        proxy, frontend = proxied
        for target in ODD_TARGETS:
            answer = await raw_exchange(proxy.port, get(target))
            assert answer.startswith(b"HTTP/1.1 200"), (target, answer[:200])
            assert frontend.requests[-1].request_line == b"GET " + target + b" HTTP/1.1"
        assert len(frontend.requests) == len(ODD_TARGETS)

    async def test_what_aiohttps_client_drops(self, proxied):
        """The two documented exceptions: a fragment (never part of a request
        target, RFC 9112 3.2; frontends drop it too) and a bare trailing ``?``."""
        proxy, frontend = proxied
        await raw_exchange(proxy.port, get(b"/v1/models?x=%41#frag"))
        assert frontend.requests[-1].request_line == b"GET /v1/models?x=%41 HTTP/1.1"
        await raw_exchange(proxy.port, get(b"/v1/models?"))
        assert frontend.requests[-1].request_line == b"GET /v1/models HTTP/1.1"

    async def test_absolute_form_forwarded_by_path_not_an_upstream_error(self, proxied):
        proxy, frontend = proxied
        cases = {
            b"http://example.com/v1/models?x=1": b"/v1/models?x=1",
            b"HTTP://Example.COM:80/v1/../v1/models?q=%ff": b"/v1/../v1/models?q=%ff",
            b"http://example.com": b"/",
            b"https://example.com?a=b": b"/?a=b",
        }
        for target, path in cases.items():
            answer = await raw_exchange(proxy.port, get(target))
            assert answer.startswith(b"HTTP/1.1 200"), (target, answer[:200])
            assert frontend.requests[-1].request_line == b"GET " + path + b" HTTP/1.1"
        metrics = await proxy.metrics()
        for kind in ("connect", "connect_timeout", "read_timeout", "broken", "bad_response"):
            assert sample(metrics, "shadow_proxy_upstream_errors_total", kind=kind) == 0, kind


class TestBodies:
    """The body reaches the frontend as the client sent it, with its encoding header."""

    @pytest.mark.parametrize(
        ("encoding", "body"),
        [
            (
                b"gzip",
                gzip.compress(
                    b'{"model":"m","messages":[{"role":"user","content":"hi"}]}', mtime=0
                ),
            ),
            (b"deflate", zlib.compress(b'{"model":"m","prompt":"deflated"}')),
            (b"br", os.urandom(512)),  # not decodable here: forwarded all the same
            (b"gzip", b"not gzip at all \x00\xff"),  # a lying header: not the proxy's business
            (b"gzip, identity", gzip.compress(b"{}" * 1000, mtime=0)),
            (None, bytes(range(256)) * 64),
        ],
    )
    async def test_encoded_bodies_byte_for_byte(self, proxied, encoding, body):
        proxy, frontend = proxied
        headers = [b"Content-Encoding: " + encoding] if encoding else []
        answer = await raw_exchange(proxy.port, post(b"/v1/chat/completions", body, *headers))
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        received = frontend.requests[-1]
        assert received.body == body
        assert received.header("content-encoding") == (encoding.decode() if encoding else None)
        assert received.header("content-length") == str(len(body))

    async def test_chunked_request_body(self, proxied):
        """A chunked body is reassembled (the framing is hop-by-hop), the bytes kept."""
        proxy, frontend = proxied
        body = gzip.compress(b'{"prompt":"' + b"x" * 3000 + b'"}', mtime=0)
        chunks = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 100]), body[i : i + 100])
            for i in range(0, len(body), 100)
        )
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: p\r\nContent-Encoding: gzip\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunks + b"0\r\n\r\n"
        )
        answer = await raw_exchange(proxy.port, request)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert frontend.requests[-1].body == body
        assert frontend.requests[-1].header("content-encoding") == "gzip"


class TestExpectContinue:
    """``Expect: 100-continue`` is answered by the proxy and not forwarded."""

    async def test_proxy_answers_100_and_the_frontend_never_sees_expect(self, proxied):
        """The frontend never sends 100: forwarding ``Expect`` would hang the request."""
        import asyncio

        proxy, frontend = proxied
        body = b'{"model":"m","prompt":"p"}'
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: p\r\nExpect: 100-continue\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            )
            async with asyncio.timeout(5):
                interim = await reader.readuntil(b"\r\n\r\n")
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(body)
            async with asyncio.timeout(10):
                answer = await reader.read()
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        received = frontend.requests[-1]
        assert received.body == body
        assert received.header("expect") is None

    async def test_over_the_limit_413_without_100(self, tmp_path):
        async with RawFrontend() as frontend:
            extra = f"upstream: {{url: '{frontend.url}', max_request_bytes: 1000}}\n"
            text = config_text(reserve_port(), frontend.url).replace(
                f"upstream: {{url: '{frontend.url}'}}\n", extra
            )
            proxy = Proxy(tmp_path, text).start()
            try:
                await proxy.wait_ready()
                answer = await raw_response(
                    proxy.port,
                    b"POST /v1/completions HTTP/1.1\r\nHost: p\r\nExpect: 100-continue\r\n"
                    b"Content-Length: 5000\r\nConnection: close\r\n\r\n",
                )
            finally:
                proxy.stop()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"100 Continue" not in answer
        assert frontend.requests == []


class TestEncodedBodiesAreMirrored:
    """With taps: the frontend gets the gzip bytes, the worker decodes its own copy."""

    async def test_gzip_request_gives_the_same_record_as_plain(
        self, tmp_path, model_dirs, subscribe
    ):
        tap_port = reserve_port()
        extra = (
            "upstream: {url: 'URL', max_request_bytes: 100000}\n"
            f"models:\n  - {{name: deepseek, tokenizer: '{model_dirs['deepseek']}'}}\n"
            f"taps:\n  - {{name: a, capture: request, endpoint: 'tcp://127.0.0.1:{tap_port}'}}\n"
        )
        chat = {"model": "deepseek", "messages": [{"role": "user", "content": "hello there"}]}
        plain = json.dumps(chat).encode()
        async with RawFrontend() as frontend:
            text = config_text(reserve_port(), frontend.url).replace(
                f"upstream: {{url: '{frontend.url}'}}\n", extra.replace("URL", frontend.url)
            )
            proxy = Proxy(tmp_path, text).start()
            sub = subscribe(f"tcp://127.0.0.1:{tap_port}", "shadow-requests-a")
            try:
                await proxy.wait_ready()
                await sub.wait_heartbeats()
                for n, (body, headers) in enumerate(
                    (
                        (plain, []),
                        (gzip.compress(plain, mtime=0), [b"Content-Encoding: gzip"]),
                        (zlib.compress(plain), [b"Content-Encoding: deflate"]),
                    ),
                    1,
                ):
                    answer = await raw_exchange(
                        proxy.port, post(b"/v1/chat/completions", body, *headers)
                    )
                    assert answer.startswith(b"HTTP/1.1 200")
                    assert frontend.requests[-1].body == body
                    records = await sub.wait_records(n, timeout=30)
                # A bomb: small on the wire, over max_request_bytes decoded.
                bomb = gzip.compress(b" " * 200_000, mtime=0)
                answer = await raw_exchange(
                    proxy.port, post(b"/v1/chat/completions", bomb, b"Content-Encoding: gzip")
                )
                assert answer.startswith(b"HTTP/1.1 200")
                assert frontend.requests[-1].body == bomb

                async def counted() -> bool:
                    metrics = await proxy.metrics()
                    return (
                        sample(metrics, "shadow_not_mirrored_total", reason="body_too_large") == 1
                    )

                await wait_until(counted, 10, 0.2, what="the bomb counted as body_too_large")
            finally:
                assert proxy.stop() == 0
        token_ids = [r["request"]["token_ids"] for r in records]
        assert token_ids[0] and token_ids[0] == token_ids[1] == token_ids[2]
