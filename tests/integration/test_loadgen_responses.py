"""The load generator's Responses load against the built-in frontend's ``/v1/responses``
(the load a fourth demo run would send)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadow_proxy.devtools.frontend import (
    STATS_KEY,
    MockConfig,
    ServedModel,
    load_models,
    serve_mock_frontend,
)
from shadow_proxy.devtools.loadgen import LoadSpec, make_body, run_load

pytestmark = [pytest.mark.timeout(60)]

MODEL = "deepseek"


@pytest.fixture(scope="module")
def served(model_dirs: dict[str, Path]) -> dict[str, ServedModel]:
    return load_models(MockConfig(models={MODEL: model_dirs[MODEL]}))


class TestResponsesLoad:
    """``api="responses"``: bodies, usage under the chat names, cancels."""

    def test_body(self) -> None:
        spec = LoadSpec(url="", model=MODEL, api="responses", output_tokens=7, stream=False)
        body = json.loads(make_body(spec, 3))
        assert body == {
            "model": MODEL,
            "input": body["input"],
            "max_output_tokens": 7,
            "stream": False,
        }
        assert body["input"].startswith("Request 3. ")

    @pytest.mark.parametrize(
        ("stream", "cancel"), [(True, 0.0), (False, 0.0), (True, 0.25)], ids=str
    )
    async def test_run(self, model_dirs, served, stream: bool, cancel: float) -> None:
        config = MockConfig(models={MODEL: model_dirs[MODEL]}, itl_ms=2)
        async with serve_mock_frontend(config, served) as (url, app):
            spec = LoadSpec(
                url=url,
                model=MODEL,
                api="responses",
                requests=24,
                concurrency=4,
                prompt_tokens=64,
                output_tokens=8,
                stream=stream,
                cancel_fraction=cancel,
            )
            report = await run_load(spec)
            stats = app[STATS_KEY]
        summary = report.summary()
        cancelled = sum(map(spec.cancels, range(24)))
        assert summary["errors"] == 0
        assert summary["cancelled"] == cancelled
        assert summary["ok"] == 24 - cancelled
        assert summary["completion_tokens"] == 8 * (24 - cancelled)
        assert stats.requests_started == 24
        ok = [r for r in report.results if r.ok]
        assert all(r.usage["prompt_tokens"] == r.usage["input_tokens"] > 64 - 8 for r in ok)
        if cancel:
            assert 0 < cancelled < 24
            assert stats.requests_cancelled == cancelled
