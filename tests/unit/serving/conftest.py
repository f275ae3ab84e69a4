"""The serving tests' frontend (scripted, on loopback) and the proxy in front of it."""

from __future__ import annotations

import pytest

from tests.support.scripted import Frontend
from tests.support.servers import proxy_config, run_proxy, serve


@pytest.fixture
async def frontend():
    f = Frontend()
    async with serve(f.app) as url:
        f.url = url
        yield f


@pytest.fixture
async def proxy(frontend):
    async with run_proxy(proxy_config(frontend.url)) as (url, registry, app):
        yield url, registry
