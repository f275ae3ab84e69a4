"""The serving process's server as production runs it (``running``), in-process on
loopback: the listening socket and its start-up errors, the connection cap (503
and a place that frees), requests the parser rejects counted by kind, and the
open-files limit."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from shadow_proxy.config import Config
from shadow_proxy.devtools import reference_taps
from shadow_proxy.devtools.processes import bound_socket, wait_until
from shadow_proxy.serving.server import Running, listen_socket, raise_fd_limit, running
from shadow_proxy.serving.supervisor import StartupError
from tests.support.scripted import Frontend
from tests.support.servers import serve

pytestmark = pytest.mark.timeout(30)

GET = b"GET /v1/models HTTP/1.1\r\nHost: p\r\n\r\n"


def config(upstream: str, *, port: int = 0, host: str = "127.0.0.1", **listen) -> Config:
    mapping = reference_taps.proxy_config(upstream, port=port, host=host)
    mapping["listen"].update(listen)
    return Config.from_mapping(mapping, path="proxy.yaml")


@contextlib.asynccontextmanager
async def started(**listen) -> AsyncIterator[tuple[Running, CollectorRegistry]]:
    frontend = Frontend()
    async with serve(frontend.app) as upstream:
        registry = CollectorRegistry()
        async with running(
            config(upstream, **listen), registry=registry, sock=bound_socket()
        ) as proxy:
            yield proxy, registry


async def exchange(url: str, data: bytes, timeout: float = 5.0) -> bytes:
    """``data`` on a new connection; what comes back until the server closes."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        async with asyncio.timeout(timeout):
            return await reader.read(-1)
    finally:
        writer.close()


class TestListenSocket:
    """A port that cannot be had is a one-line start-up error naming its key."""

    def test_port_in_use(self) -> None:
        with bound_socket() as taken:  # a listener holds the port
            port = taken.getsockname()[1]
            with pytest.raises(StartupError) as error:
                listen_socket(config("http://127.0.0.1:9", port=port))
        message = str(error.value)
        assert message.startswith("proxy.yaml:"), message
        assert message.endswith(
            f" 'listen.port': cannot listen on 127.0.0.1:{port} (address already in use)"
        )

    def test_host_that_does_not_resolve(self) -> None:
        with pytest.raises(StartupError, match=r"'listen\.host' cannot be resolved"):
            listen_socket(config("http://127.0.0.1:9", host="no.such.host.invalid"))

    def test_bound_and_listening(self) -> None:
        with listen_socket(config("http://127.0.0.1:9")) as sock:
            assert sock.getsockname()[0] == "127.0.0.1" and not sock.getblocking()
            with socket.create_connection(sock.getsockname(), timeout=5):
                pass


class TestConnectionCap:
    """At most ``listen.max_connections`` client connections at once; the next one
    is answered 503 and closed, counted, and a place frees when one closes."""

    async def test_refused_then_a_place_frees(self, caplog) -> None:
        async with started(max_connections=3) as (proxy, registry):
            held = []
            try:
                for _ in range(3):
                    held.append((await asyncio.open_connection(*proxy.url[7:].split(":")))[1])
                await wait_until(lambda: proxy.cap.open == 3, what="3 connections accepted")
                refused = [await exchange(proxy.url, GET) for _ in range(2)]
                for answer in refused:
                    assert answer.startswith(b"HTTP/1.1 503"), answer[:100]
                    assert b"too_many_connections" in answer and b"Retry-After: 1" in answer
                value = registry.get_sample_value
                assert value("shadow_proxy_connections_refused_total") == 2
                assert value("shadow_proxy_client_connections") == 3
                held.pop().close()
                await wait_until(lambda: proxy.cap.open == 2, what="a place freed")
                served = await exchange(
                    proxy.url, GET.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
                )
                assert served.startswith(b"HTTP/1.1 200"), served[:100]
            finally:
                for writer in held:
                    writer.close()
        said = [r for r in caplog.records if "listen.max_connections (3) reached" in r.getMessage()]
        assert len(said) == 1  # logged once, rate-limited


class TestRejected:
    """What aiohttp's parser refuses is answered 400, never forwarded, and counted by kind."""

    @pytest.mark.parametrize(
        ("request_bytes", "kind"),
        [
            (b"GET /v1/models HTTP/1.1\r\nHost: p\r\nNo Colon\r\n\r\n", "bad_request"),
            (b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: p\r\n\r\n", "too_long"),
            (b"\x01\x02 / HTTP/1.1\r\nHost: p\r\n\r\n", "bad_method"),
        ],
    )
    async def test_counted(self, request_bytes: bytes, kind: str) -> None:
        async with started() as (proxy, registry):
            answer = await exchange(proxy.url, request_bytes)
            assert answer.split(b" ")[1] == b"400", answer[:100]
            counted = {
                s.labels["kind"]: s.value
                for m in registry.collect()
                if m.name == "shadow_proxy_rejected_requests"
                for s in m.samples
                if s.name.endswith("_total") and s.value
            }
            assert counted == {kind: 1.0}


class TestFileLimit:
    """The soft limit on open files is raised to the hard limit."""

    def test_raised(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            if hard != resource.RLIM_INFINITY:
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
            before, after = raise_fd_limit()
            now = resource.getrlimit(resource.RLIMIT_NOFILE)
            assert now[0] == after
            if hard != resource.RLIM_INFINITY:
                assert (before, after) == (min(soft, 256), hard)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
