"""shadow-replay --closed-loop against conversations captured in front of the real
Dynamo 1.6.1 frontend and mocker (issue 28).

For each of the two models (deepseek, chatml), three conversations of three
turns run at once through the proxy in front of Dynamo: a client that reads
each streamed answer, sends it back as the assistant message, and waits a
think time of 0.2 to 1.2 s before its next turn (one conversation names itself
with ``x-dynamo-session-id``, the others are grouped by their prompts). They
are replayed closed-loop to a candidate that answers with its own text, longer
than the mocker's and at another latency.

What is proven:

- every later turn the candidate receives holds the candidate's own answers to
  the earlier turns, token for token as the Dynamo profile renders that
  conversation, and none of the primary's;
- each later turn leaves the recorded think time (within 100 ms) after the
  candidate's previous answer ended;
- the records were grouped as they were sent (session 3, prefix 6), nothing
  fell back to open-loop, and the report has its per-turn table;
- open-loop (the default) still sends the recorded prompts as they are.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shadow_proxy.devtools.dynamo import REPO, start_dynamo
from shadow_proxy.devtools.processes import reserve_port, wait_until
from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.replay.runner import Replay, ReplayOptions
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model
from tests.integration.replay_capture import Consumer, file_records, load_records
from tests.support.closed_loop import serve_candidate
from tests.support.dynamo import require_dynamo
from tests.support.servers import proxy_config, run_proxy

pytestmark = [pytest.mark.dynamo, pytest.mark.slow, pytest.mark.timeout(300)]

MODELS = REPO / ".models"
#: Per conversation, the think time before each later turn.
THINKS_S = ((0.2, 0.5), (0.8, 0.3), (1.2, 0.4))
MAX_TOKENS = 8


def messages(conversation: int, answers: list[str]) -> list[dict[str, str]]:
    out = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": f"Conversation {conversation}: where do we start?"},
    ]
    for k, answer in enumerate(answers):
        out += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"And step {k + 1}?"},
        ]
    return out


async def answer_of(resp: aiohttp.ClientResponse) -> str:
    text = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


async def converse(session: aiohttp.ClientSession, url: str, model: str, c: int) -> None:
    answers: list[str] = []
    headers = {"x-dynamo-session-id": "conversation-0"} if c == 0 else {}
    for k in range(len(THINKS_S[c]) + 1):
        body = {
            "model": model,
            "messages": messages(c, answers),
            "max_tokens": MAX_TOKENS,
            "stream": True,
        }
        async with session.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={**headers, "x-request-id": f"c{c}-t{k}"},
        ) as resp:
            assert resp.status == 200, await resp.text()
            answers.append(await answer_of(resp))
        if k < len(THINKS_S[c]):
            await asyncio.sleep(THINKS_S[c][k])  # the client's think time, recorded


@pytest.fixture(scope="module", params=["deepseek", "chatml"])
def model(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def records(model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require_dynamo()
    from shadow_proxy.devtools.modeldirs import build_all

    build_all(MODELS)
    scratch = tmp_path_factory.mktemp(f"closed-loop-{model}")
    dynamo = asyncio.run(start_dynamo(MODELS / model, model, scratch / "dynamo", 10.0))
    try:
        yield asyncio.run(capture(dynamo.base_url, model, scratch))
    finally:
        dynamo.stop()


async def capture(upstream: str, model: str, out: Path) -> Path:
    endpoint = f"tcp://127.0.0.1:{reserve_port()}"
    tap = {"name": "joined", "topic": "joined", "capture": "request_response"}
    taps = [{**tap, "emit": "joined", "endpoint": endpoint, "capacity": 1024}]
    models = [{"name": model, "tokenizer": str(MODELS / model)}]
    config = proxy_config(upstream, models=models, taps=taps)
    consumer = Consumer(endpoint, "joined", out, 1 << 30)
    turns = sum(len(t) + 1 for t in THINKS_S)
    try:
        async with run_proxy(config) as (url, _registry, _app):
            await wait_until(lambda: consumer.read().get("heartbeats", 0) >= 1, timeout=15)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                conversations = (converse(session, url, model, c) for c in range(len(THINKS_S)))
                await asyncio.gather(*conversations)
            await wait_until(lambda: consumer.read().get("records") == turns, timeout=30)
    finally:
        consumer.close()
    return consumer.records


@pytest.fixture(scope="module")
def dynamo_profile(model: str) -> Preprocessor:
    return Preprocessor({model: load_model(model, str(MODELS / model), None)})


def rendered(pre: Preprocessor, conversation: int, answers: list[str]) -> list[int]:
    (model,) = pre._models
    body = json.dumps({"model": model, "messages": messages(conversation, answers)})
    result = pre.preprocess(Route.CHAT, body.encode(), 0)
    assert isinstance(result, PreprocessedRequest)
    return result.token_ids


async def replay(
    records: Path, out: Path, url: str, model: str, closed_loop: bool
) -> dict[str, Any]:
    options = ReplayOptions(
        candidate=url,
        out_dir=out,
        concurrency=4,
        tokenizer=MODELS / model,
        closed_loop=closed_loop,
    )
    source, unreadable = file_records(records)
    return await Replay(options, "shadow-replay --closed-loop").run(source, unreadable)


def recorded_thinks(envelopes: list[dict[str, Any]]) -> dict[str, float]:
    """Request id of a later turn -> the think time the proxy saw before it (s)."""
    by_id = {e["request_id"]: e for e in envelopes}
    out = {}
    for rid, envelope in by_id.items():
        c, k = (int(part[1:]) for part in rid.split("-"))
        if k:
            previous = by_id[f"c{c}-t{k - 1}"]
            end = previous["arrival_unix_ns"] + previous["response"]["end_offset_ns"]
            out[rid] = (envelope["arrival_unix_ns"] - end) / 1e9
    return out


class TestClosedLoopDynamo:
    """Captured in front of Dynamo, replayed closed-loop."""

    async def test_candidate_sees_its_own_conversation(
        self, model, records, dynamo_profile, tmp_path
    ):
        envelopes = load_records(records)
        assert all(
            e["request"].get("prompt_spans") for e in envelopes if e["request_id"][-1] != "0"
        )
        thinks = recorded_thinks(envelopes)
        async with serve_candidate(model, delay_s=0.12) as (url, candidate):
            summary = await replay(records, tmp_path, url, model, closed_loop=True)
        seen = candidate.by_original_id()
        assert summary["replayed"] == len(envelopes) == len(seen)
        recorded = {e["request_id"]: e["request"]["token_ids"] for e in envelopes}
        for c, thinks_c in enumerate(THINKS_S):
            for k in range(len(thinks_c) + 1):
                rid = f"c{c}-t{k}"
                answers = [seen[f"c{c}-t{i}"]["answer"] for i in range(k)]
                assert seen[rid]["prompt"] == rendered(dynamo_profile, c, answers), rid
                if k:
                    assert seen[rid]["prompt"] != recorded[rid]  # none of the primary's
                    gap = (seen[rid]["came"] - seen[f"c{c}-t{k - 1}"]["ended"]) / 1e9
                    assert abs(gap - thinks[rid]) <= 0.1, (rid, gap, thinks[rid])
        closed = summary["closed_loop"]
        assert closed["records"] == {
            "grouped_by_session": 3,
            "grouped_by_prefix": 6,
            "standalone": 0,
        }
        assert closed["fell_back_open_loop"] == {}
        assert [t["turn"] for t in closed["per_turn"]] == [0, 1, 2]
        assert closed["duration_ratio_n"] == 3
        report = (tmp_path / "report.md").read_text()
        assert "## Closed loop" in report and "| turn | records |" in report

    async def test_open_loop_is_unchanged(self, model, records, tmp_path):
        envelopes = load_records(records)
        async with serve_candidate(model) as (url, candidate):
            summary = await replay(records, tmp_path, url, model, closed_loop=False)
        assert "closed_loop" not in summary
        seen = candidate.by_original_id()
        assert {rid: e["prompt"] for rid, e in seen.items()} == {
            e["request_id"]: e["request"]["token_ids"] for e in envelopes
        }
