"""The demo's services in this process: checking a given frontend, and its waits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from shadow_proxy.devtools.demo.runs import DemoError
from shadow_proxy.devtools.demo.services import (
    FrontendKnobs,
    builtin_frontends,
    check_frontend,
    get_json,
    run_tool,
    wait_for_run,
)
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


class TestFrontendKnobs:
    """The built-in frontend's options, and how the tables name them."""

    def test_pacing_only(self) -> None:
        knobs = FrontendKnobs(20.0, 5.0)
        assert knobs.argv() == ["--ttft-ms", "20.0", "--itl-ms", "5.0"]
        assert knobs.describe() == "ttft 20 ms, itl 5 ms"

    def test_diverging(self) -> None:
        knobs = FrontendKnobs(70.0, 10.0, 0.2, 4)
        assert knobs.argv()[4:] == ["--diverge-fraction", "0.2", "--diverge-at", "4"]
        assert knobs.describe() == "ttft 70 ms, itl 10 ms, 20% diverging at token 4"


@pytest.mark.timeout(120)
class TestProcesses:
    """Frontends are started together and their exit status kept; a tool runs to its end."""

    async def test_builtin_frontends(self, model_dirs: dict[str, Path], tmp_path: Path) -> None:
        statuses: dict[str, int] = {}
        knobs = {"a": FrontendKnobs(0.0, 0.0), "b": FrontendKnobs(0.0, 0.0, 1.0, 1)}
        models = {"deepseek": model_dirs["deepseek"]}
        async with builtin_frontends(models, knobs, tmp_path, statuses) as urls:
            assert set(urls) == {"a", "b"} and urls["a"] != urls["b"]
            async with aiohttp.ClientSession() as session:
                texts = []
                for name in ("a", "b"):
                    body = {"model": "deepseek", "prompt": "hi", "max_tokens": 4}
                    async with session.post(urls[name] + "/v1/completions", json=body) as r:
                        texts.append((await r.json())["choices"][0]["text"])
        assert texts[0] != texts[1]  # b diverges from token 1 on, for every request
        assert texts[0][:3] == texts[1][:3]
        assert statuses == {"a": 0, "b": 0}

    async def test_run_tool(self, tmp_path: Path) -> None:
        argv = [sys.executable, "-c", "import sys; print('x', file=sys.stderr); sys.exit(3)"]
        child = await run_tool("tool", argv, tmp_path, 30)
        assert child.exit_status == 3 and "x" in child.output_tail(1)

    async def test_run_tool_timeout_kills(self, tmp_path: Path) -> None:
        argv = [sys.executable, "-c", "import time; time.sleep(60)"]
        child = await run_tool("tool", argv, tmp_path, 0.5)
        assert child.exit_status == -9
