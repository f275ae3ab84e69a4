"""The built-in frontend's divergence knob (``diverge_fraction``, ``diverge_at``),
served on loopback and read over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from shadow_proxy.devtools.frontend import MockConfig, diverges, load_models, serve_mock_frontend
from shadow_proxy.devtools.modeldirs import build_all

MODELS_ROOT = Path(__file__).resolve().parents[1] / ".models"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def deepseek() -> Path:
    return build_all(MODELS_ROOT)["deepseek"]


async def _texts(url: str, request_id: str, *, stream: bool, n: int = 1) -> list[str]:
    body = {"model": "deepseek", "prompt": [1, 2, 3], "max_tokens": 12, "n": n, "stream": stream}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/completions", json=body, headers={"x-request-id": request_id}
        ) as resp,
    ):
        assert resp.status == 200
        if not stream:
            return [c["text"] for c in (await resp.json())["choices"]]
        texts = [""] * n
        async for line in resp.content:
            data = line.strip().removeprefix(b"data: ")
            if data and data != b"[DONE]":
                for choice in json.loads(data)["choices"]:
                    texts[choice["index"]] += choice["text"]
        return texts


class TestDivergence:
    """Requests in the fraction skip one cycle token from ``diverge_at`` on; others do not."""

    async def test_selected_requests_diverge_at_the_position(self, deepseek: Path) -> None:
        config = MockConfig(models={"deepseek": deepseek}, diverge_fraction=0.5, diverge_at=4)
        models = load_models(config)
        plain = models["deepseek"].output_texts
        ids = [f"req-{k}" for k in range(40)]
        chosen = [i for i in ids if diverges(i, 0.5)]
        assert 5 < len(chosen) < 35  # the hash spreads ids over the fraction
        async with serve_mock_frontend(config, models) as (url, _app):
            for request_id in ids:
                for stream in (True, False):
                    texts = await _texts(url, request_id, stream=stream, n=2)
                    expected = list(plain[:12])
                    if request_id in chosen:
                        expected[4:] = plain[5:13]
                    assert texts == ["".join(expected)] * 2, (request_id, stream)

    async def test_off_by_default(self, deepseek: Path) -> None:
        config = MockConfig(models={"deepseek": deepseek}, diverge_at=0)
        models = load_models(config)
        async with serve_mock_frontend(config, models) as (url, _app):
            texts = await _texts(url, "req-1", stream=True)
        assert texts == ["".join(models["deepseek"].output_texts[:12])]

    def test_fraction_is_a_subset_rule(self) -> None:
        ids = [f"r{k}" for k in range(2000)]
        small = {i for i in ids if diverges(i, 0.1)}
        large = {i for i in ids if diverges(i, 0.3)}
        assert small < large
        assert 120 < len(small) < 280
        assert all(diverges(i, 1.0) for i in ids)
