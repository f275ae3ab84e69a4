"""Nothing from a client in a log line (issue 18 item 2).

Raw-socket probes that make aiohttp's parser fail while quoting the line it
failed on (bad characters, bare CR, obs-fold, ``Authorization :``, oversized
headers, malformed chunked bodies...), each carrying its own secret, against
the real ``shadow-proxy serve`` at every log level: no secret reaches the log;
the error's kind and the peer do; a flood costs a few lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest

from shadow_proxy.devtools.processes import reserve_port
from shadow_proxy.serving.logs import CLIENT_ERROR_KINDS
from tests.integration.harness import (
    Proxy,
    RawFrontend,
    config_text,
    raw_exchange,
    sample,
)

pytestmark = pytest.mark.timeout(180)


def secret(name: str) -> bytes:
    return f"sk-SECRET-{name}-7f3a".encode()


def probes() -> dict[str, bytes]:
    """name -> raw request; each holds ``secret(name)`` where the parser fails."""
    s = {
        name: secret(name)
        for name in (
            "ctl",
            "cr",
            "fold",
            "spacecolon",
            "bigheader",
            "bigline",
            "chunksize",
            "chunkdata",
            "method",
            "target",
            "smuggle",
            "garbage",
            "headername",
            "nul",
            "clbad",
            "chunklate",
        )
    }
    host = b"Host: p\r\n"
    return {
        "ctl": b"GET / HTTP/1.1\r\n"
        + host
        + b"Authorization: Bearer "
        + s["ctl"]
        + b"\x01\r\n\r\n",
        "cr": b"GET / HTTP/1.1\r\n" + host + b"X-Key: " + s["cr"] + b"\rX-Other: 1\r\n\r\n",
        "fold": b"GET / HTTP/1.1\r\n"
        + host
        + b"Authorization: Bearer\r\n "
        + s["fold"]
        + b"\r\n\r\n",
        "spacecolon": b"GET / HTTP/1.1\r\n"
        + host
        + b"Authorization : "
        + s["spacecolon"]
        + b"\r\n\r\n",
        "bigheader": b"GET / HTTP/1.1\r\n"
        + host
        + b"X-Big: "
        + s["bigheader"]
        + b"a" * 9000
        + b"\r\n\r\n",
        "bigline": b"GET /" + s["bigline"] + b"a" * 9000 + b" HTTP/1.1\r\n" + host + b"\r\n",
        "chunksize": b"POST /v1/completions HTTP/1.1\r\n"
        + host
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + s["chunksize"]
        + b"\r\nxx\r\n0\r\n\r\n",
        "chunkdata": b"POST /v1/completions HTTP/1.1\r\n"
        + host
        + b"Transfer-Encoding: chunked\r\n\r\n5\r\n"
        + s["chunkdata"]
        + b"\r\n0\r\n\r\n",
        "method": s["method"] + b"\x01 / HTTP/1.1\r\n" + host + b"\r\n",
        "target": b"GET /" + s["target"] + b"\x7f HTTP/1.1\r\n" + host + b"\r\n",
        "smuggle": b"POST / HTTP/1.1\r\n" + host + b"Content-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\nX-Key: " + s["smuggle"] + b"\r\n\r\n0\r\n\r\n",
        "garbage": s["garbage"] + b" \x16\x03\x01garbage\r\n\r\n",
        "headername": b"GET / HTTP/1.1\r\n" + host + b"Auth\x01" + s["headername"] + b": x\r\n\r\n",
        "nul": b"GET / HTTP/1.1\r\n" + host + b"X-Key: " + s["nul"] + b"\x00\r\n\r\n",
        "clbad": b"POST / HTTP/1.1\r\n" + host + b"Content-Length: 1" + s["clbad"] + b"\r\n\r\n",
        # The body goes wrong after the handler started reading it (LATER splits).
        "chunklate": b"POST /v1/completions HTTP/1.1\r\n"
        + host
        + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        + LATER
        + b"zz"
        + s["chunklate"]
        + b"\r\nmore\r\n0\r\n\r\n",
    }


def rejected_total(metrics: str) -> float:
    return sum(
        sample(metrics, "shadow_proxy_rejected_requests_total", kind=kind)
        for kind in CLIENT_ERROR_KINDS
    )


#: In a probe: send what comes before, wait, then send the rest.
LATER = b"<LATER>"


async def send_probe(port: int, data: bytes) -> bytes:
    first, _, rest = data.partition(LATER)
    with contextlib.suppress(OSError, TimeoutError):
        if not rest:
            return await raw_exchange(port, first, timeout=5)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(first)
            await asyncio.sleep(0.2)
            writer.write(rest)
            async with asyncio.timeout(5):
                # One response (the server may linger on the connection after it).
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                return head + await reader.readexactly(int(length.group(1)) if length else 0)
        finally:
            writer.close()
    return b""


@pytest.mark.parametrize(
    ("level", "parser"),
    [("debug", "C"), ("info", "C"), ("warning", "C"), ("error", "C"), ("debug", "Python")],
)
async def test_no_probe_secret_reaches_the_log(tmp_path, model_dirs, level, parser):
    """Both of aiohttp's HTTP parsers (its C one, and the pure-Python one it
    falls back to) fail differently on a body that breaks mid-read."""
    env = {"AIOHTTP_NO_EXTENSIONS": "1"} if parser == "Python" else {}
    async with RawFrontend() as frontend:
        # A body that breaks after it started makes aiohttp's C parser stop
        # without failing the reader: the body timeout answers (408).
        text = config_text(reserve_port(), frontend.url, listen="body_timeout_s: 1")
        if level == "debug":  # the tap worker's log too, at the most verbose level
            text += (
                f"models:\n  - {{name: deepseek, tokenizer: '{model_dirs['deepseek']}'}}\n"
                f"taps:\n  - {{name: a, capture: request, "
                f"endpoint: 'tcp://127.0.0.1:{reserve_port()}'}}\n"
            )
        proxy = Proxy(tmp_path, text, log_level=level, env=env).start()
        try:
            await proxy.wait_ready()
            answers = {}
            for name, data in probes().items():
                answers[name] = await send_probe(proxy.port, data)
            # A valid request with a key and a prompt: forwarded, never logged.
            valid_secret = secret("valid")
            body = b'{"model":"deepseek","messages":[{"role":"user","content":"' + (
                valid_secret + b'"}]}'
            )
            answer = await raw_exchange(
                proxy.port,
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nAuthorization: Bearer "
                + valid_secret
                + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n" % len(body) + body,
            )
            assert answer.startswith(b"HTTP/1.1 200")
            metrics = await proxy.metrics()
        finally:
            assert proxy.stop() == 0
    log = proxy.log()
    for name in [*probes(), "valid"]:
        assert secret(name) not in log, f"{name}'s secret in the {level} log"
        assert secret(name).lower() not in log.lower()
    # The probes were rejected by the proxy itself (not vacuous), and counted.
    rejected = {
        name
        for name, answer in answers.items()
        if answer.startswith((b"HTTP/1.0 4", b"HTTP/1.1 4"))
    }
    unanswered = [(n, a[:40]) for n, a in answers.items() if n not in rejected]
    assert not unanswered
    timeouts = sample(metrics, "shadow_proxy_body_timeouts_total")
    assert rejected_total(metrics) + timeouts == len(rejected), metrics
    # The body that broke mid-read: 400 from the handler (Python parser) or
    # 408 at the body timeout (C parser), never a 500.
    assert answers["chunklate"].split(b" ", 2)[1] == (b"400" if parser == "Python" else b"408")
    if level in ("debug", "info", "warning"):
        assert b"rejected by the HTTP parser" in log
        assert b"from 127.0.0.1" in log
    assert b"Traceback" not in log


async def test_a_flood_of_malformed_requests_costs_a_few_lines(tmp_path):
    """1,000 malformed 8 KB requests: a few lines of log, every one counted."""
    async with RawFrontend() as frontend:
        proxy = Proxy(tmp_path, config_text(reserve_port(), frontend.url)).start()
        try:
            await proxy.wait_ready()
            before = len(proxy.log())
            probe = b"GET / HTTP/1.1\r\nHost: p\r\nX-Key: " + b"k" * 8000 + b"\x01\r\n\r\n"
            semaphore = asyncio.Semaphore(20)

            async def one() -> None:
                async with semaphore:
                    await send_probe(proxy.port, probe)

            await asyncio.gather(*(one() for _ in range(1000)))
            metrics = await proxy.metrics()
        finally:
            assert proxy.stop() == 0
    grown = len(proxy.log()) - before
    assert grown < 5_000, f"{grown} bytes of log for 1,000 malformed requests"
    assert rejected_total(metrics) == 1000
