"""Closed loop against a candidate on loopback: each later turn carries the
candidate's own earlier answers, leaves the recorded think time after the
candidate's previous answer, and a conversation without spans falls back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.replay.closed_loop import ClosedLoop, _Thread, _Turn
from shadow_proxy.replay.conversations import Conversation
from shadow_proxy.replay.request import Skip
from shadow_proxy.replay.runner import Replay, ReplayOptions
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model
from tests.support.closed_loop import serve_candidate

pytestmark = pytest.mark.timeout(60)

ARRIVAL_NS = 1_700_000_000_000_000_000
PRIMARY_END_NS = 40_000_000
THINK_S = (0.3, 0.6)


@pytest.fixture
async def candidate():
    async with serve_candidate("deepseek") as served:
        yield served


@pytest.fixture(scope="module")
def preprocessor(model_dirs: dict[str, Path]) -> Preprocessor:
    return Preprocessor({"deepseek": load_model("deepseek", str(model_dirs["deepseek"]), None)})


def messages(conversation: int, answers: list[str]) -> list[dict[str, str]]:
    out = [{"role": "user", "content": f"conversation {conversation}, question 0"}]
    for k, answer in enumerate(answers):
        out += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"question {k + 1}"},
        ]
    return out


def prompt(pre: Preprocessor, history: list[dict[str, str]]) -> Any:
    body = json.dumps({"model": "deepseek", "messages": history}).encode()
    return pre.preprocess(Route.CHAT, body, 0)


def conversation_records(
    pre: Preprocessor, conversation: int, turns: int, think_s: float, *, spans: bool = True
) -> list[dict[str, Any]]:
    """One conversation's joined records: the primary answered "Primary k." to
    turn k in 40 ms, and the client sent the next turn ``think_s`` later."""
    records, arrival = [], ARRIVAL_NS + conversation * 100_000_000
    for k in range(turns):
        answers = [f"Primary {i}." for i in range(k)]
        pre_request = prompt(pre, messages(conversation, answers))
        request: dict[str, Any] = {
            "model": "deepseek",
            "token_ids": pre_request.token_ids,
            "stop_conditions": {"max_tokens": 16},
        }
        if spans and pre_request.prompt_spans:
            request["prompt_spans"] = pre_request.prompt_spans
        records.append(
            {
                "schema_version": 1,
                "tap": "t",
                "seq": conversation * 100 + k,
                "request_id": f"c{conversation}-t{k}",
                "origin": "chat",
                "arrival_unix_ns": arrival,
                "request": request,
                "response": {
                    "outcome": "complete",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "output_tokens": 3,
                            "text": f"Primary {k}.",
                        }
                    ],
                    "output_tokens": 3,
                    "first_token_offset_ns": 20_000_000,
                    "last_token_offset_ns": 30_000_000,
                    "end_offset_ns": PRIMARY_END_NS,
                },
            }
        )
        arrival += PRIMARY_END_NS + int(think_s * 1e9)
    return records


async def feed(records: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for record in sorted(records, key=lambda r: r["arrival_unix_ns"]):
        yield record


def pair_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]


def options(out: Path, url: str, model_dirs: dict[str, Path], **kwargs: Any) -> ReplayOptions:
    return ReplayOptions(
        candidate=url,
        out_dir=out,
        concurrency=4,
        closed_loop=True,
        tokenizer=model_dirs["deepseek"],
        **kwargs,
    )


class TestClosedLoop:
    """The candidate's own answers, the recorded think time."""

    async def test_turns_carry_the_candidates_answers(
        self, candidate, preprocessor, model_dirs, tmp_path
    ):
        url, fake = candidate
        records = [
            *conversation_records(preprocessor, 0, 3, THINK_S[0]),
            *conversation_records(preprocessor, 1, 3, THINK_S[1]),
        ]
        summary = await Replay(options(tmp_path, url, model_dirs), "t").run(feed(records))
        assert summary["replayed"] == 6
        by_conversation: dict[int, list[dict[str, Any]]] = {}
        for entry in fake.seen:
            for c in (0, 1):
                if entry["prompt"][:8] == prompt(preprocessor, messages(c, [])).token_ids[:8]:
                    by_conversation.setdefault(c, []).append(entry)
        for c, think in enumerate(THINK_S):
            sent = by_conversation[c]
            assert len(sent) == 3
            for k, entry in enumerate(sent):
                answers = [earlier["answer"] for earlier in sent[:k]]
                assert entry["prompt"] == prompt(preprocessor, messages(c, answers)).token_ids
                if k:  # never early; how late is the scheduler's (TestDue plans it)
                    gap = (entry["came"] - sent[k - 1]["ended"]) / 1e9
                    assert gap >= think - 0.001, (c, k, gap)
        for line in pair_lines(tmp_path):
            if line["turn"]:
                think = THINK_S[int(line["request_id"][1])] * 1e3  # "c{c}-t{k}"
                assert line["think_ms"] == think and line["waited_ms"] >= think - 0.001, line
        closed = summary["closed_loop"]
        assert closed["records"] == {
            "grouped_by_session": 0,
            "grouped_by_prefix": 6,
            "standalone": 0,
        }
        assert closed["fell_back_open_loop"] == {}
        assert [t["records"] for t in closed["per_turn"]] == [2, 2, 2]
        assert closed["turns_completed"] == 6
        assert closed["duration_ratio_n"] == 2
        assert "## Closed loop" in (tmp_path / "report.md").read_text()

    async def test_without_spans_falls_back(self, candidate, preprocessor, model_dirs, tmp_path):
        url, fake = candidate
        records = conversation_records(preprocessor, 0, 2, 0.2, spans=False)
        summary = await Replay(options(tmp_path, url, model_dirs), "t").run(feed(records))
        assert summary["closed_loop"]["fell_back_open_loop"] == {"no_spans": 1}
        assert [e["prompt"] for e in fake.seen] == [r["request"]["token_ids"] for r in records]

    async def test_warmup_is_not_counted(self, candidate, preprocessor, model_dirs, tmp_path):
        url, _fake = candidate
        records = conversation_records(preprocessor, 0, 3, 0.2)
        summary = await Replay(options(tmp_path, url, model_dirs, warmup=1), "t").run(feed(records))
        assert summary["replayed"] == 2
        assert summary["run"]["warmup"]["excluded"] == 1
        assert [t["turn"] for t in summary["closed_loop"]["per_turn"]] == [1, 2]

    def test_needs_a_tokenizer(self, tmp_path):
        with pytest.raises(ValueError, match="needs '--tokenizer'"):
            Replay(ReplayOptions(candidate="http://x", out_dir=tmp_path, closed_loop=True), "t")


class TestDue:
    """When a later turn goes out, planned on times the test sets (the wall
    clock's lateness under load is the scheduler's, not the plan's)."""

    @staticmethod
    def plan(*, speed=None, fallback=None, after_ns=None, now=5_000):
        async def send(record: Any, request: Any) -> None:
            raise AssertionError("planning sends nothing")

        loop = ClosedLoop(lambda e: Skip("x"), send, lambda t: [], speed, clock=lambda: now)
        later = {"arrival_unix_ns": 1_000_800}  # 800 ns after the first turn arrived
        thread = _Thread(fallback=fallback, first_sent_ns=2_000, first_arrival=1_000_000)
        turn = _Turn(later, later, Conversation(0), 1, think_ns=300, after_ns=after_ns)
        return loop.due_ns(thread, turn, now)

    def test_think_after_the_candidates_answer(self):
        assert self.plan(after_ns=4_000) == 4_300

    def test_open_loop_keeps_the_recorded_offset_over_speed(self):
        assert self.plan(fallback="answers", speed=2.0, after_ns=4_000) == 2_000 + 400
        assert self.plan(fallback="answers", after_ns=4_000) == 5_000


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}


def tool_records(pre: Preprocessor, primary_call_text: str, tokenizer: Any) -> list[dict]:
    """A tool-calling conversation: turn 0 answered with a call (its raw text
    ``primary_call_text``), turn 1 sends the tool's result, turn 2 follows the
    answer to that."""
    first = [{"role": "user", "content": "weather in Oslo?"}]
    second = [
        *first,
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    third = [*second, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "ok"}]
    out = []
    for k, history in enumerate((first, second, third)):
        body = json.dumps({"model": "chatml", "messages": history}).encode()
        result = pre.preprocess(Route.CHAT, body, 0)
        text = primary_call_text if k == 0 else "Sunny."
        request: dict[str, Any] = {"model": "chatml", "token_ids": result.token_ids}
        if result.prompt_spans:
            request["prompt_spans"] = result.prompt_spans
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        out.append(
            {
                "schema_version": 1,
                "tap": "t",
                "seq": k,
                "request_id": f"tool-t{k}",
                "origin": "chat",
                "arrival_unix_ns": ARRIVAL_NS + k * 300_000_000,
                "request": request,
                "response": {
                    "outcome": "complete",
                    "choices": [{"index": 0, "finish_reason": "stop", "token_ids": ids}],
                    "output_tokens": len(ids),
                    "end_offset_ns": PRIMARY_END_NS,
                },
            }
        )
    return out


@pytest.fixture(scope="module")
def chatml(model_dirs: dict[str, Path]) -> Preprocessor:
    return Preprocessor({"chatml": load_model("chatml", str(model_dirs["chatml"]), None)})


class TestToolCalls:
    """A tool-calling turn answered alike keeps the loop; answered otherwise, the
    conversation goes open-loop (the tool results answer the primary's call)."""

    async def test_answered_alike(self, chatml, model_dirs, tmp_path):
        from shadow_proxy.replay.options import load_tokenizer

        tokenizer = load_tokenizer(model_dirs["chatml"])
        same = "Candidate answer 1, longer than the primary's."  # what the candidate says first
        records = tool_records(chatml, same, tokenizer)
        async with serve_candidate("chatml") as (url, fake):
            opts = options(tmp_path, url, model_dirs, speed=None)
            opts = attrs.evolve(opts, tokenizer=model_dirs["chatml"])
            summary = await Replay(opts, "t").run(feed(records))
        assert summary["closed_loop"]["fell_back_open_loop"] == {}
        seen = fake.by_original_id()
        assert seen["tool-t1"]["prompt"] == records[1]["request"]["token_ids"]  # the call kept
        answer = seen["tool-t1"]["answer"]
        history = [
            {"role": "user", "content": "weather in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "ok"},
        ]
        body = json.dumps({"model": "chatml", "messages": history}).encode()
        assert seen["tool-t2"]["prompt"] == chatml.preprocess(Route.CHAT, body, 0).token_ids

    async def test_answered_otherwise(self, chatml, model_dirs, tmp_path):
        from shadow_proxy.replay.options import load_tokenizer

        records = tool_records(chatml, "<tool_call>other", load_tokenizer(model_dirs["chatml"]))
        async with serve_candidate("chatml") as (url, fake):
            opts = attrs.evolve(
                options(tmp_path, url, model_dirs, speed=None), tokenizer=model_dirs["chatml"]
            )
            summary = await Replay(opts, "t").run(feed(records))
        assert summary["closed_loop"]["fell_back_open_loop"] == {"tool_calls": 1}
        assert [e["prompt"] for e in fake.seen] == [r["request"]["token_ids"] for r in records]
