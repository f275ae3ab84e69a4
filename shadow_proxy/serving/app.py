"""The application: wiring of the handler, the client session, the tap worker
and the proxy's own endpoints.

``make_app(config, registry=...)`` returns an ``aiohttp.web.Application``;
resources with a lifetime (the client session, the hand-off socket, the tap
worker process) are created and closed in cleanup contexts.

The proxy's own endpoints take precedence over forwarding: ``/healthz``,
``/readyz``, ``/metrics`` and ``/shadow/taps`` (GET). Everything else, any
method and any path, goes to the frontend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from shadow_proxy.config import Config
from shadow_proxy.serving.metrics import ProxyMetrics, loop_lag_histogram
from shadow_proxy.serving.proxy import ProxyHandler
from shadow_proxy.serving.supervisor import TAPS, taps_context

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", Config)
REGISTRY = web.AppKey("registry", CollectorRegistry)
METRICS = web.AppKey("metrics", ProxyMetrics)
HANDLER = web.AppKey("handler", ProxyHandler)
SESSION = web.AppKey("session", aiohttp.ClientSession)
READY = web.AppKey("ready", dict)

#: How long ``/readyz`` trusts its last answer.
READY_CACHE_S = 1.0
#: ``SHADOW_PROXY_LOOP_LAG=1`` samples the serving loop's lag into
#: ``shadow_proxy_loop_lag_seconds`` every ``LOOP_LAG_INTERVAL_S`` (benchmarks).
LOOP_LAG_ENV = "SHADOW_PROXY_LOOP_LAG"
LOOP_LAG_INTERVAL_S = 0.01


def client_session(config: Config) -> aiohttp.ClientSession:
    """The one session to the frontend.

    Bodies stay as they came (``auto_decompress=False``); no default headers
    are added (the client's pass through); no total timeout (generations run
    for minutes): a socket connect timeout and an optional read timeout.
    The pool holds at most ``max_connections`` connections.
    """
    upstream = config.upstream
    connector = aiohttp.TCPConnector(
        limit=upstream.max_connections,
        limit_per_host=0,
        enable_cleanup_closed=False,
        ttl_dns_cache=60,
    )
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=None,
        sock_connect=upstream.connect_timeout_s,
        sock_read=upstream.read_timeout_s,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
        read_bufsize=2**16,
    )


def make_app(config: Config, *, registry: CollectorRegistry | None = None) -> web.Application:
    registry = registry if registry is not None else CollectorRegistry()
    metrics = ProxyMetrics.create(registry)
    app = web.Application(
        client_max_size=config.upstream.max_request_bytes, middlewares=[_pathless_target]
    )
    app[CONFIG] = config
    app[REGISTRY] = registry
    app[METRICS] = metrics
    if config.taps:
        # First in, last out: the worker starts before the session (a failed
        # start leaves nothing open) and stops after the last request ended.
        app.cleanup_ctx.append(taps_context(config, metrics, registry))
    app.cleanup_ctx.append(_session_ctx)
    if os.environ.get(LOOP_LAG_ENV) == "1":
        app.cleanup_ctx.append(_loop_lag_ctx)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/shadow/taps", taps_endpoint)
    # Any path, newlines (%0A) included: the frontend decides what it serves.
    app.router.add_route("*", r"/{tail:[\s\S]*}", forward, expect_handler=expect_continue)
    return app


async def _session_ctx(app: web.Application):
    config = app[CONFIG]
    session = client_session(config)
    app[SESSION] = session
    app[HANDLER] = ProxyHandler(
        session=session,
        upstream_url=config.upstream.url,
        request_id_header=config.request_id_header,
        max_request_bytes=config.upstream.max_request_bytes,
        metrics=app[METRICS],
        handoff=app[TAPS].handoff if TAPS in app else None,
        body_timeout_s=config.listen.body_timeout_s,
        quick_ack=config.upstream.quick_ack,
        not_mirrored=app[TAPS].relay.not_mirrored if TAPS in app else None,
    )
    app[READY] = {"at": -READY_CACHE_S}
    yield
    await session.close()


async def _loop_lag_ctx(app: web.Application):
    """Samples the serving loop's lag while the app runs (one task, one sleep
    every 10 ms: about a hundred wake-ups a second)."""
    histogram = loop_lag_histogram(app[REGISTRY])

    async def sample() -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(LOOP_LAG_INTERVAL_S)
            histogram.observe(max(0.0, loop.time() - started - LOOP_LAG_INTERVAL_S))

    task = asyncio.create_task(sample())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _on_shutdown(app: web.Application) -> None:
    """Runs when the server has stopped accepting: in-flight streams get
    ``shutdown_grace_s`` once, then are cut (their records end as
    ``shutdown``); the cleanup contexts (the taps' drain) run after this."""
    handler = app.get(HANDLER)
    if handler is not None:
        await handler.stop(app[CONFIG].shutdown_grace_s)


async def forward(request: web.Request) -> web.StreamResponse:
    return await request.app[HANDLER](request)


@web.middleware
async def _pathless_target(request: web.Request, handler) -> web.StreamResponse:
    """An absolute-form target without a path (``GET http://host?q``) matches
    no route in aiohttp's router (its path is empty); it is forwarded as the
    frontend's ``/`` like any other target."""
    if request.match_info.http_exception is not None and not request.rel_url.path_safe:
        return await forward(request)
    return await handler(request)


async def expect_continue(request: web.Request) -> None:
    """``Expect: 100-continue``: the proxy answers it and does not forward it.

    It sends ``100 Continue`` as the handler starts reading the body, unless
    the announced body is over ``max_request_bytes``: then the handler answers
    413 at once and the client never sends the body. Other expectations: 417,
    as aiohttp does.
    """
    if request.version != aiohttp.HttpVersion11:
        return
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text="only 100-continue is supported")
    if (request.content_length or 0) > request.app[CONFIG].upstream.max_request_bytes:
        return
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    # As aiohttp's own expect handler: the body of the response has not started.
    request.writer.output_size = 0


async def healthz(request: web.Request) -> web.Response:
    """The process is up and serving."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """The frontend answers (any HTTP status below 500 on ``GET /v1/models``)."""
    app = request.app
    now = time.monotonic()
    if now - app[READY]["at"] < READY_CACHE_S:
        return web.json_response({"status": "ready"})
    config = app[CONFIG]
    try:
        async with app[SESSION].get(
            config.upstream.url + "/v1/models",
            timeout=aiohttp.ClientTimeout(total=config.upstream.connect_timeout_s),
        ) as response:
            await response.read()
            ok = response.status < 500
    except (TimeoutError, aiohttp.ClientError):
        ok = False
    if ok:
        app[READY]["at"] = now
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "frontend not answering"}, status=503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def taps_endpoint(request: web.Request) -> web.Response:
    """Each tap's name, topic, endpoint, capture mode, filters and counters."""
    taps = request.app.get(TAPS)
    listing = taps.listing() if taps is not None else []
    return web.json_response({"taps": listing})
