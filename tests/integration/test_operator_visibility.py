"""What an operator sees (issue 17 item 12): 413s on mirrored routes counted as
not mirrored; 413s, streams the frontend broke and tap drops logged,
rate-limited, without a header or body byte."""

from __future__ import annotations

import asyncio
import time

import pytest

from shadow_proxy.devtools.processes import reserve_port
from tests.integration.harness import (
    Proxy,
    RawFrontend,
    config_text,
    raw_exchange,
    sample,
)

pytestmark = pytest.mark.timeout(120)

SECRET = b"sk-SECRET-visibility-91c2"


def chat(body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer "
        + SECRET
        + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % len(body)
        + body
    )


def body_of(size: int) -> bytes:
    head = b'{"model":"deepseek","messages":[{"role":"user","content":"' + SECRET
    return head + b"x" * (size - len(head) - 4) + b'"}]}'


async def poll(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := await predicate()):
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.2)
    return value


async def test_413_counted_as_not_mirrored_and_tap_drops_logged(tmp_path, model_dirs):
    """max_request_bytes 3000: 20 bodies of 4000 bytes get 413 and count as
    ``too_large``; handoff_max_bytes 2000: a 2500-byte body is lost on the way
    to the worker, a tap drop the supervisor logs."""
    extra = (
        f"models:\n  - {{name: deepseek, tokenizer: '{model_dirs['deepseek']}'}}\n"
        f"taps:\n  - {{name: a, capture: request, endpoint: 'tcp://127.0.0.1:{reserve_port()}'}}\n"
        "worker: {handoff_max_bytes: 2000}\n"
    )
    async with RawFrontend() as frontend:
        text = config_text(reserve_port(), frontend.url, extra).replace(
            f"upstream: {{url: '{frontend.url}'}}",
            f"upstream: {{url: '{frontend.url}', max_request_bytes: 3000}}",
        )
        proxy = Proxy(tmp_path, text).start()
        try:
            await proxy.wait_ready()
            for _ in range(20):
                answer = await raw_exchange(proxy.port, chat(body_of(4000)))
                assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
            # Lost on the way to the worker (over the hand-off byte bound), then
            # one that gets through and carries the count of the lost one.
            for size in (2500, 200):
                answer = await raw_exchange(proxy.port, chat(body_of(size)))
                assert answer.startswith(b"HTTP/1.1 200"), answer[:100]

            async def counted():
                metrics = await proxy.metrics()
                dropped = sample(
                    metrics, "shadow_tap_dropped_total", tap="a", reason="handoff_full"
                )
                return dropped == 1 and metrics

            metrics = await poll(counted)
            await poll(lambda: _async(b"tap a dropped 1 record(s)" in proxy.log()))
        finally:
            assert proxy.stop() == 0
    assert sample(metrics, "shadow_not_mirrored_total", reason="too_large") == 20
    assert sample(metrics, "shadow_proxy_requests_total", route="chat", status_class="4xx") == 20
    log = proxy.log()
    assert SECRET not in log
    lines_413 = [line for line in log.splitlines() if b"answered 413 on chat" in line]
    assert 1 <= len(lines_413) <= 5, lines_413  # rate-limited: 20 events, a few lines
    assert b"handoff_full=1" in log


async def _async(value):
    return value


async def test_stream_broken_by_the_frontend_is_logged(tmp_path):
    partial = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b'\r\n10\r\ndata: {"a": 1}\n\n\r\n'
    )
    async with RawFrontend(partial, close_after=True) as frontend:
        proxy = Proxy(tmp_path, config_text(reserve_port(), frontend.url)).start()
        try:
            await proxy.wait_ready()
            for _ in range(10):
                answer = await raw_exchange(proxy.port, chat(body_of(300)))
                assert answer.startswith(b"HTTP/1.1 200")
                assert not answer.endswith(b"0\r\n\r\n")  # the client sees the break too
            metrics = await proxy.metrics()
        finally:
            assert proxy.stop() == 0
    assert sample(metrics, "shadow_proxy_upstream_errors_total", kind="broken") == 10
    log = proxy.log()
    lines = [line for line in log.splitlines() if b"broke mid-stream" in line]
    assert 1 <= len(lines) <= 5, lines
    assert b"on chat broke mid-stream (ClientPayloadError)" in lines[0]
    assert SECRET not in log
