"""Shared fixtures: real servers on loopback, production server settings, polling."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from shadow_proxy.config import Config
from shadow_proxy.devtools import reference_taps
from shadow_proxy.serving.app import make_app
from tests.support.subscriber import TapSubscriber

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / ".models"


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


def proxy_config(upstream_url: str, **options: Any) -> Config:
    """A valid config forwarding to ``upstream_url``, listening on any free
    loopback port; ``options`` as ``devtools.reference_taps.proxy_config`` takes
    them (``models`` a name -> tokenizer mapping, ``taps``, top-level keys)."""
    return Config.from_mapping(reference_taps.proxy_config(upstream_url, **options))


@contextlib.asynccontextmanager
async def run_proxy(
    config: Config, registry: CollectorRegistry | None = None
) -> AsyncIterator[tuple[str, CollectorRegistry, web.Application]]:
    registry = registry or CollectorRegistry()
    app = make_app(config, registry=registry)
    async with serve(app) as url:
        yield url, registry, app


#: Set to 1 to skip the tests that need the real Dynamo (developers without it).
SKIP_DYNAMO_ENV = "SHADOW_PROXY_SKIP_DYNAMO"


def require_dynamo() -> Path:
    """The Dynamo venv's Python, for tests marked ``dynamo``.

    Dynamo missing is a failure, not a skip: ``make test`` installs it (``make
    dynamo``), so a missing install in CI is a broken pipeline, not a reason to
    pass silently. Outside CI, ``SHADOW_PROXY_SKIP_DYNAMO=1`` skips these tests;
    under ``CI=true`` that variable is ignored.
    """
    from shadow_proxy.devtools.dynamo import DynamoUnavailable, dynamo_python

    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if os.environ.get(SKIP_DYNAMO_ENV) == "1" and not in_ci:
        pytest.skip(f"{SKIP_DYNAMO_ENV}=1")
    try:
        return dynamo_python()
    except DynamoUnavailable as e:
        hint = "" if in_ci else f" (or set {SKIP_DYNAMO_ENV}=1 to skip the Dynamo tests)"
        pytest.fail(f"{e}{hint}", pytrace=False)


@pytest.fixture
def subscribe() -> Iterator[Callable[..., TapSubscriber]]:
    """Opens test subscribers (``TapSubscriber(endpoint, topic)``); all are
    closed when the test ends."""
    opened: list[TapSubscriber] = []

    def open_subscriber(endpoint: str, topic: str, **options: Any) -> TapSubscriber:
        subscriber = TapSubscriber(endpoint, topic, **options)
        opened.append(subscriber)
        return subscriber

    yield open_subscriber
    for subscriber in opened:
        subscriber.close()


@pytest.fixture(scope="session")
def model_dirs() -> dict[str, Path]:
    """The two local model directories (built here if ``make models`` has not run)."""
    from shadow_proxy.devtools.modeldirs import build_all

    return build_all(MODELS_DIR)
