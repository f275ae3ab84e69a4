"""Running the serving process: the listening socket, the HTTP server's
settings, the connection cap, signals and the graceful stop.

``run(config)`` is ``shadow-proxy serve``'s main. In order, at start-up:

1. the soft file-descriptor limit is raised to the hard limit (logged);
2. the listening socket is bound: a port in use is a one-line start-up error
   (exit 2) before any worker is spawned;
3. the app starts (the tap worker is spawned and loads its tokenizers);
4. the server accepts, and only then ``serving on ...`` is logged.

The server's settings are the proxy's, whoever runs it (``running``):
request bodies are not decompressed (``auto_decompress=False``: the body is
forwarded as it came), handlers are cancelled when their client goes away,
there is no access log, and the server's error log goes through
``logs.ClientErrorFilter`` (kind and peer, never the client's bytes).

At most ``listen.max_connections`` client connections are open at once: a
connection past the cap is answered ``503`` and closed (counted, logged
rate-limited), so a flood of idle connections cannot use up the descriptors
the frontend connections need.

SIGTERM or SIGINT: the server stops accepting, in-flight streams get
``shutdown_grace_s`` once (``ProxyHandler.stop``), then the taps drain and the
process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import resource
import signal
import socket
from collections.abc import AsyncIterator

import attrs
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry

from shadow_proxy.config import Config
from shadow_proxy.serving.app import METRICS, make_app
from shadow_proxy.serving.logs import RateLimited, error_kind, guard_server_logging
from shadow_proxy.serving.metrics import ProxyMetrics
from shadow_proxy.serving.supervisor import StartupError

log = logging.getLogger(__name__)
#: The logger the HTTP server reports client errors to (filtered: kind and peer).
server_log = logging.getLogger("shadow_proxy.serving.clients")

#: Idle keep-alive connections are closed after this (as ``run_app``'s default).
KEEPALIVE_S = 75.0
#: aiohttp's own wait for handlers after ``ProxyHandler.stop`` has ended them:
#: a backstop only (every exchange has ended or been cancelled by then).
SERVER_SHUTDOWN_S = 1.0
BACKLOG = 1024
#: Descriptors besides client and upstream connections (sockets of the taps'
#: hand-off, logs, the listening socket, libraries).
FD_MARGIN = 64


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit; returns (old, new)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, hard


def listen_socket(config: Config) -> socket.socket:
    """The bound, listening socket of ``listen.host:listen.port``; a
    ``StartupError`` naming the key's line when it cannot be had."""
    host, port = config.listen.host, config.listen.port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        msg = f"{config.where('listen.host')} cannot be resolved: {host!r} ({e.strerror})"
        raise StartupError(msg) from e
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        reason = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
        msg = f"{config.where('listen.port')}: cannot listen on {host}:{port} ({reason})"
        raise StartupError(msg) from e
    sock.setblocking(False)
    return sock


class ConnectionCap:
    """Counts open client connections; past ``limit`` a new one is refused."""

    def __init__(self, limit: int, metrics: ProxyMetrics):
        self.limit = limit
        self.open = 0
        self.metrics = metrics
        self.oplog = RateLimited(log, burst=1, interval_s=60.0)

    def opened(self) -> bool:
        if self.open >= self.limit:
            self.metrics.connections_refused.inc()
            self.oplog.log(
                "cap",
                logging.WARNING,
                "listen.max_connections (%d) reached: new client connections are "
                "answered 503 and closed",
                self.limit,
            )
            return False
        self.open += 1
        self.metrics.client_connections.set(self.open)
        return True

    def closed(self) -> None:
        self.open -= 1
        self.metrics.client_connections.set(self.open)


class _CountedHandler(RequestHandler):
    """aiohttp's connection handler, releasing its place in the cap when lost
    and counting the requests its parser rejects (by kind, at any log level)."""

    __slots__ = ("_cap", "_rejected")

    def __init__(self, cap: ConnectionCap, manager: web.Server, **settings):
        super().__init__(manager, **settings)
        self._cap: ConnectionCap | None = cap
        self._rejected = cap.metrics.rejected_requests

    def handle_error(self, request, status=500, exc=None, message=None):
        """aiohttp's error answer (400 for what its parser rejects, 500 for a
        bug), counted by kind first."""
        if exc is not None:
            self._rejected.labels(error_kind(exc)).inc()
        return super().handle_error(request, status, exc, message)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._cap is not None:
            self._cap.closed()
            self._cap = None
        super().connection_lost(exc)


_REFUSAL_BODY = json.dumps(
    {
        "error": {
            "message": "the proxy has too many open connections; retry later",
            "type": "too_many_connections",
            "code": 503,
        }
    }
).encode()
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s"
    % (len(_REFUSAL_BODY), _REFUSAL_BODY)
)


#: How long a refused connection stays open for its client to read the 503
#: (closing at once with the request unread resets the connection, and the
#: client may see the reset instead of the answer).
REFUSED_LINGER_S = 0.5


class _Refused(asyncio.Protocol):
    """A connection past the cap: one 503, the write side shut, what the client
    sends discarded, closed when it closes or after ``REFUSED_LINGER_S``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(_REFUSAL)  # type: ignore[attr-defined]
        if transport.can_write_eof():  # type: ignore[attr-defined]
            transport.write_eof()  # type: ignore[attr-defined]
        self.timer = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        self.transport.close()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.timer.cancel()


class CappedSite(web.SockSite):
    """A site on a bound socket whose connections go through ``ConnectionCap``."""

    __slots__ = ("_cap", "_settings")

    def __init__(
        self, runner: web.AppRunner, sock: socket.socket, cap: ConnectionCap, settings: dict
    ) -> None:
        super().__init__(runner, sock, backlog=BACKLOG)
        self._cap = cap
        self._settings = settings

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        cap, settings = self._cap, self._settings

        def protocol() -> asyncio.BaseProtocol:
            if not cap.opened():
                return _Refused()
            return _CountedHandler(cap, server, loop=loop, **settings)

        self._server = await loop.create_server(protocol, sock=self._sock, backlog=BACKLOG)


def handler_settings() -> dict:
    """aiohttp's per-connection settings for the proxy (see the module docstring)."""
    return {
        "keepalive_timeout": KEEPALIVE_S,
        "access_log": None,
        "logger": server_log,
        "auto_decompress": False,
    }


@attrs.define
class Running:
    """A started proxy: its URL and app."""

    url: str
    app: web.Application
    cap: ConnectionCap


@contextlib.asynccontextmanager
async def running(
    config: Config, *, registry: CollectorRegistry | None = None, sock: socket.socket | None = None
) -> AsyncIterator[Running]:
    """Start the proxy as production runs it; stop it (graceful) on exit.

    Raises ``StartupError`` (socket, tap worker) before anything is served.
    """
    sock = sock if sock is not None else listen_socket(config)
    try:
        app = make_app(config, registry=registry)
        metrics = app[METRICS]
        guard_server_logging(server_log)
        settings = handler_settings()
        runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=SERVER_SHUTDOWN_S, **settings
        )
        await runner.setup()  # the tap worker starts here
    except BaseException:
        sock.close()
        raise
    try:
        cap = ConnectionCap(config.listen.max_connections, metrics)
        site = CappedSite(runner, sock, cap, settings)
        await site.start()
        host, port = sock.getsockname()[:2]
        yield Running(url=f"http://{host}:{port}", app=app, cap=cap)
    finally:
        await runner.cleanup()


async def serve(config: Config) -> None:
    """Serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    before, after = raise_fd_limit()
    async with running(config):
        log.info(
            "serving on %s:%d, forwarding to %s, %d tap(s)",
            config.listen.host,
            config.listen.port,
            config.upstream.url,
            len(config.taps),
        )
        if after != before:
            log.info("open files: soft limit raised from %d to the hard limit %d", before, after)
        else:
            log.info("open files: limit %d (the hard limit)", after)
        needed = config.listen.max_connections + config.upstream.max_connections + FD_MARGIN
        if needed > after:
            log.warning(
                "open files: the limit %d is below listen.max_connections + "
                "upstream.max_connections + %d (%d): clients may be refused by the "
                "system before the proxy's cap",
                after,
                FD_MARGIN,
                needed,
            )
        await stop.wait()
        log.info("stopping: in-flight streams get %.1fs", config.shutdown_grace_s)


def run(config: Config) -> None:
    """``shadow-proxy serve``: serve on uvloop until a signal; ``StartupError``
    when it cannot start."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(config))
