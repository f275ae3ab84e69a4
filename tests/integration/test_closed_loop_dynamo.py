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
- each later turn is planned to leave the recorded think time after the
  candidate's previous answer ended, and never leaves before it (how late it
  leaves on a loaded host is the event loop's; ``TestDue`` checks the plan);
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

import pytest

from shadow_proxy.devtools.dynamo import REPO, start_dynamo
from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.replay.runner import Replay, ReplayOptions
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model
from tests.integration.conversations_capture import THINKS_S, capture_conversations, messages
from tests.integration.replay_capture import file_records, load_records
from tests.support.closed_loop import serve_candidate
from tests.support.dynamo import require_dynamo

# Solo: two Dynamo starts and a capture per model are heavy for the two-worker part.
pytestmark = [pytest.mark.dynamo, pytest.mark.slow, pytest.mark.solo, pytest.mark.timeout(300)]

MODELS = REPO / ".models"


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
        yield asyncio.run(capture_conversations(dynamo.base_url, model, MODELS / model, scratch))
    finally:
        dynamo.stop()


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
                    assert gap >= thinks[rid] - 0.001, (rid, gap, thinks[rid])
        lines = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
        for line in lines:
            if line["turn"]:
                recorded_ms = thinks[line["request_id"]] * 1e3
                assert abs(line["think_ms"] - recorded_ms) < 0.001, line
                assert line["waited_ms"] >= line["think_ms"] - 0.001, line
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
