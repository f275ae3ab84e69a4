"""The built-in frontend served on loopback with its production settings, and clients for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from shadow_proxy.devtools.frontend import (
    MockConfig,
    ServedModel,
    load_models,
    serve_mock_frontend,
)
from tests.support.frontend import Server


@pytest.fixture(scope="session")
def served(model_dirs: dict[str, Path]) -> dict[str, ServedModel]:
    return load_models(MockConfig(models=model_dirs))


@pytest.fixture(scope="session")
def hf_tokenizers(model_dirs: dict[str, Path]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(str(path)) for name, path in model_dirs.items()}


@pytest.fixture
async def start(
    model_dirs: dict[str, Path], served: dict[str, ServedModel]
) -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    """Start a mock frontend with config overrides; stopped at teardown."""
    async with asyncio.timeout(60):
        stack: list[Any] = []

        async def _start(**overrides: Any) -> Server:
            config = MockConfig(models=model_dirs, **overrides)
            context = serve_mock_frontend(config, served)
            server = await context.__aenter__()
            stack.append(context)
            return server

        yield _start
        for context in reversed(stack):
            await context.__aexit__(None, None, None)


@pytest.fixture
async def server(start: Callable[..., Awaitable[Server]]) -> Server:
    return await start()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=10
    ) as c:
        yield c


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session
