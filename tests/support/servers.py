"""Real servers on loopback, run as production runs them.

``serve`` runs any aiohttp application with the production settings
(``handler_cancellation`` on, no access log) on a port the kernel picks when
the site binds (no race); ``run_proxy`` runs the proxy's own application that
way; ``proxy_config`` is a valid configuration built by
``devtools.reference_taps.proxy_config``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from shadow_proxy.config import Config
from shadow_proxy.devtools import reference_taps
from shadow_proxy.serving.app import make_app


@contextlib.asynccontextmanager
async def serve(app: web.Application, *, handler_cancellation: bool = True) -> AsyncIterator[str]:
    """Run ``app`` as production runs it (``handler_cancellation`` on, no access
    log) on a free loopback port; yields the base URL."""
    runner = web.AppRunner(
        app, handler_cancellation=handler_cancellation, access_log=None, shutdown_timeout=1.0
    )
    try:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


#: The tap worker's priority in tests. The default (SCHED_IDLE: CPU no other task
#: wants) starves it on a machine shared with other jobs, which makes timings
#: meaningless; the idle class is tested on its own (tests/unit/worker/test_priority.py,
#: tests/integration/test_worker_pool.py).
TEST_WORKER = {"priority": "nice", "nice": 5}


def proxy_config(upstream_url: str, **options: Any) -> Config:
    """A valid config forwarding to ``upstream_url``, listening on any free
    loopback port; ``options`` as ``devtools.reference_taps.proxy_config`` takes
    them (``models`` a name -> tokenizer mapping, ``taps``, top-level keys). The
    worker runs at ``TEST_WORKER``'s priority unless ``worker`` says otherwise."""
    options["worker"] = {**TEST_WORKER, **options.get("worker", {})}
    return Config.from_mapping(reference_taps.proxy_config(upstream_url, **options))


@contextlib.asynccontextmanager
async def run_proxy(
    config: Config, registry: CollectorRegistry | None = None
) -> AsyncIterator[tuple[str, CollectorRegistry, web.Application]]:
    """The proxy's application for ``config`` on loopback (its tap worker, if
    any, started and ready); yields its URL, registry and application."""
    registry = registry or CollectorRegistry()
    app = make_app(config, registry=registry)
    async with serve(app) as url:
        yield url, registry, app
