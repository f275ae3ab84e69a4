"""The demo's services in this process: checking a given frontend, and its waits."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from shadow_proxy.devtools.demo.runs import DemoError
from shadow_proxy.devtools.demo.services import check_frontend, get_json, wait_for_run
from shadow_proxy.devtools.processes import WaitTimeout, reserve_port
from tests.support.servers import serve


def models_app(listing: Any, status: int = 200) -> web.Application:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response(listing, status=status)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    return app


class TestCheckFrontend:
    """A frontend that does not answer, or does not serve the model, fails early."""

    async def test_serves_the_model(self) -> None:
        async with serve(models_app({"data": [{"id": "deepseek"}]})) as url:
            await check_frontend(url, "deepseek")

    async def test_an_empty_listing_is_taken_on_trust(self) -> None:
        async with serve(models_app({"data": []})) as url:
            await check_frontend(url, "deepseek")

    async def test_another_model(self) -> None:
        async with serve(models_app({"data": [{"id": "other"}]})) as url:
            with pytest.raises(DemoError, match=r"does not serve 'deepseek' \(it serves \['other'"):
                await check_frontend(url, "deepseek")

    @pytest.mark.parametrize("status", [404, 500])
    async def test_an_error_status(self, status: int) -> None:
        async with serve(models_app({}, status)) as url:
            with pytest.raises(DemoError, match="does not answer GET /v1/models"):
                await check_frontend(url, "deepseek")

    async def test_nothing_listening(self) -> None:
        with pytest.raises(DemoError, match="does not answer"):
            await check_frontend(f"http://127.0.0.1:{reserve_port()}", "deepseek")


class TestWaits:
    """A fatal wait raises; a wait that is not fatal says so and returns None."""

    async def test_fatal(self) -> None:
        async def never() -> bool:
            return False

        with pytest.raises(WaitTimeout, match="the thing: not within"):
            await wait_for_run("the thing", never, [], 0.1)

    async def test_not_fatal(self, capsys: pytest.CaptureFixture[str]) -> None:
        async def never() -> bool:
            return False

        assert await wait_for_run("the thing", never, [], 0.1, fatal=False) is None
        assert "demo: the thing: not within" in capsys.readouterr().err

    async def test_get_json_is_none_until_it_answers_200(self) -> None:
        async with serve(models_app({"a": 1}, 503)) as url, aiohttp.ClientSession() as s:
            assert await get_json(s, url + "/v1/models") is None
        async with serve(models_app({"a": 1})) as url, aiohttp.ClientSession() as s:
            assert await get_json(s, url + "/v1/models") == {"a": 1}
