"""The built-in frontend the replay tests send to (a real server on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shadow_proxy.devtools.frontend import MockConfig, load_models, serve_mock_frontend


@pytest.fixture(scope="module")
def loaded(model_dirs: dict[str, Path]) -> dict:
    return load_models(MockConfig(models={"deepseek": model_dirs["deepseek"]}))


@pytest.fixture
async def frontend(model_dirs: dict[str, Path], loaded: dict) -> AsyncIterator[str]:
    """The built-in frontend with 80 ms to the first token and 20 ms between tokens."""
    config = MockConfig(models={"deepseek": model_dirs["deepseek"]}, ttft_ms=80, itl_ms=20)
    async with serve_mock_frontend(config, loaded) as (url, _app):
        yield url
