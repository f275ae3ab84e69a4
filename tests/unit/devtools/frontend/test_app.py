"""The application's routes: models, health and stats."""

from __future__ import annotations

import aiohttp
import openai

from tests.support.frontend import HELLO, Server


class TestEndpoints:
    """Models, health and stats."""

    async def test_models(self, client: openai.AsyncOpenAI) -> None:
        models = [m.id async for m in client.models.list()]
        assert models == ["deepseek", "chatml"]

    async def test_health(self, server: Server, http: aiohttp.ClientSession) -> None:
        async with http.get(server[0] + "/health") as resp:
            assert resp.status == 200

    async def test_stats(
        self, client: openai.AsyncOpenAI, server: Server, http: aiohttp.ClientSession
    ) -> None:
        await client.chat.completions.create(model="deepseek", messages=HELLO, max_tokens=3, n=2)
        async with http.get(server[0] + "/mock/stats") as resp:
            stats = await resp.json()
        assert stats == {
            "requests_started": 1,
            "requests_completed": 1,
            "requests_cancelled": 0,
            "requests_failed": 0,
            "requests_rejected": 0,
            "tokens_generated": 6,
            "in_flight": 0,
        }
