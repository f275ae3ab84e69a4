"""The built-in frontend's application and its server.

``make_app`` runs once per app: it loads the models (unless given loaded
ones), starts the prompt-encoding pool (shut down in a cleanup context) and
routes ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``
(``responses.py``), ``/v1/models``,
``/health`` and ``/mock/stats``. ``serve_mock_frontend`` runs the app as
production runs it (handler cancellation on, no access log), so a client that
goes away cancels its generation.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from shadow_proxy.devtools.frontend.config import MockConfig
from shadow_proxy.devtools.frontend.handlers import Handlers, MockStats
from shadow_proxy.devtools.frontend.models import ServedModel, load_models
from shadow_proxy.devtools.frontend.responses import ResponsesHandler

STATS_KEY = web.AppKey("mock_stats", MockStats)
MODELS_KEY = web.AppKey("mock_models", dict)
CONFIG_KEY = web.AppKey("mock_config", MockConfig)


def make_app(
    config: MockConfig, models: Mapping[str, ServedModel] | None = None
) -> web.Application:
    """The mock frontend's application. ``models`` lets callers share loaded
    models between apps (tests); by default they are loaded from ``config``."""
    loaded = dict(models) if models is not None else load_models(config)
    missing = sorted(set(config.models) - set(loaded))
    if missing:
        msg = f"'models' has no loaded model for {missing}"
        raise ValueError(msg)
    stats = MockStats()
    pool = (
        ThreadPoolExecutor(config.tokenizer_threads, thread_name_prefix="mock-tokenizer")
        if config.tokenizer_threads
        else None
    )
    handlers = Handlers(config, loaded, stats, pool)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATS_KEY] = stats
    app[MODELS_KEY] = loaded
    app[CONFIG_KEY] = config

    async def shutdown_pool(_app: web.Application) -> AsyncIterator[None]:
        yield
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    app.cleanup_ctx.append(shutdown_pool)
    app.router.add_post("/v1/chat/completions", handlers.chat)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_post("/v1/responses", ResponsesHandler(handlers).handle)
    app.router.add_get("/v1/models", handlers.list_models)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/mock/stats", handlers.get_stats)
    return app


@contextlib.asynccontextmanager
async def serve_mock_frontend(
    config: MockConfig,
    models: Mapping[str, ServedModel] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> AsyncIterator[tuple[str, web.Application]]:
    """Run the mock on ``host:port`` (0: any free port) with the production
    settings (handler cancellation on, no access log); yields the base URL
    (``http://host:port``, without ``/v1``) and the app."""
    app = make_app(config, models)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}", app
    finally:
        await runner.cleanup()
