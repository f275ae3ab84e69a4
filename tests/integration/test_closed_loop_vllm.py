"""shadow-replay --closed-loop with vLLM 0.32 as the candidate (issue 28).

Conversations captured through the proxy in front of Dynamo 1.6.1 (mocker,
serving the fleet's ``llama`` model dir) are replayed closed-loop to the
fleet's ``llama-other`` (other weights: other answers), with prefix caching and
prompt-token details on. Every turn is answered, none falls back, each later
turn's prompt is as long as vLLM counts it (the spliced prompt was sent as it
is), and the per-turn cached share is reported: a later turn resends the
candidate's own previous prompt and answer, which vLLM's prefix cache holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from shadow_proxy.devtools.dynamo import start_dynamo
from shadow_proxy.replay.runner import Replay, ReplayOptions
from tests.integration.conversations_capture import capture_conversations
from tests.integration.replay_capture import file_records, load_records
from tests.support import MODELS_DIR
from tests.support.dynamo import require_dynamo
from tests.support.vllm import Fleet

pytestmark = [pytest.mark.dynamo, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

MODEL = "llama"


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require_dynamo()
    from shadow_proxy.devtools.tiny_llama import build_fleet

    model_dir = build_fleet(MODELS_DIR)[MODEL]
    scratch = tmp_path_factory.mktemp("closed-loop-vllm")
    dynamo = asyncio.run(start_dynamo(model_dir, MODEL, scratch / "dynamo", 10.0))
    try:
        yield asyncio.run(capture_conversations(dynamo.base_url, MODEL, model_dir, scratch))
    finally:
        dynamo.stop()


async def test_vllm_candidate(vllm_fleet: Fleet, records: Path, tmp_path: Path) -> None:
    server = await vllm_fleet.ready("llama-other")
    options = ReplayOptions(
        candidate=server.base_url,
        out_dir=tmp_path,
        concurrency=4,
        tokenizer=MODELS_DIR / MODEL,
        closed_loop=True,
    )
    source, unreadable = file_records(records)
    summary = await Replay(options, "shadow-replay --closed-loop").run(source, unreadable)
    envelopes = load_records(records)
    assert summary["replayed"] == len(envelopes) and summary["errors"] == 0
    closed = summary["closed_loop"]
    assert closed["fell_back_open_loop"] == {}
    assert closed["turns_completed"] == len(envelopes)
    assert summary["prompt_token_mismatches"] == 0
    later = [t for t in closed["per_turn"] if t["turn"] > 0]
    assert later and all(t["cached_share_mean"] is not None for t in later)
    print(summary["closed_loop"])  # the figures of the report (pytest -s)
