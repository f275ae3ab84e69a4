"""Smoke test against the real Dynamo 1.6.1 frontend + mocker (``devtools/dynamo.py``)."""

from __future__ import annotations

import json
import urllib.request

import pytest
import pytest_asyncio

from shadow_proxy.devtools.dynamo import REPO, start_dynamo
from tests.support.dynamo import require_dynamo

pytestmark = [pytest.mark.dynamo, pytest.mark.timeout(180)]

MODEL_DIR = REPO / ".models" / "deepseek"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dynamo(tmp_path_factory: pytest.TempPathFactory):
    require_dynamo()
    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.fail(f"{MODEL_DIR} missing; run `python -m shadow_proxy.devtools.modeldirs .models`")
    scratch = tmp_path_factory.mktemp("dynamo")
    dynamo = await start_dynamo(MODEL_DIR, "deepseek", scratch, speedup=1000)
    yield dynamo
    await dynamo.aclose()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        return json.loads(r.read())


def test_models_lists_served_name(dynamo) -> None:
    with urllib.request.urlopen(dynamo.base_url + "/v1/models", timeout=10) as r:
        ids = [m["id"] for m in json.loads(r.read())["data"]]
    assert ids == ["deepseek"]


def test_chat_prompt_tokens_match_hf_template(dynamo) -> None:
    from transformers import AutoTokenizer

    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello, 世界 🙂 123"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Again?"},
    ]
    out = _post(
        dynamo.base_url + "/v1/chat/completions",
        {"model": "deepseek", "messages": messages, "max_tokens": 4},
    )
    ids = AutoTokenizer.from_pretrained(MODEL_DIR).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True
    )
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert out["usage"]["completion_tokens"] == 4
