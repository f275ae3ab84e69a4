"""The multi-turn load: turns resend their history, one turn at a time per
conversation, against a recording frontend and the built-in one."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from shadow_proxy.devtools import conversations
from shadow_proxy.devtools.conversations import ConversationSpec, run_conversations
from shadow_proxy.devtools.frontend import MockConfig, serve_mock_frontend
from tests.support.servers import serve

pytestmark = pytest.mark.timeout(60)


def sse(*events: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


class Recorder:
    """A chat frontend that keeps every request (and when its answer ended) and
    answers ``answer {request id}`` in two deltas."""

    def __init__(self, fail: str | None = None) -> None:
        self.seen: list[dict[str, Any]] = []
        self.fail = fail

    async def chat(self, request: web.Request) -> web.StreamResponse:
        rid = request.headers["x-request-id"]
        entry = {
            "rid": rid,
            "session": request.headers.get("x-dynamo-session-id"),
            "body": await request.json(),
            "ended": False,
        }
        self.seen.append(entry)
        if rid == self.fail:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(
            sse(
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                {"choices": [{"index": 0, "delta": {"content": "answer "}}]},
                {"choices": [{"index": 0, "delta": {"content": rid}}]},
                {"choices": [], "usage": {"prompt_tokens": len(self.seen), "completion_tokens": 2}},
            )
            + b"data: [DONE]\n\n"
        )
        entry["ended"] = True
        return response

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


def spec(url: str, **kw: Any) -> ConversationSpec:
    shape = {
        "conversations": 2,
        "turns": 3,
        "system_tokens": 20,
        "first_tokens": 20,
        "turn_tokens": 10,
        "output_tokens": 2,
    }
    return ConversationSpec(url=url, model="deepseek", **{**shape, **kw})


class TestTurns:
    """Each turn is the previous turn's messages, the answer it got and a new user message."""

    async def test_history_grows(self) -> None:
        recorder = Recorder()
        async with serve(recorder.app()) as url:
            report = await run_conversations(spec(url))
        assert [r.index for r in report.results] == list(range(6))
        assert all(r.ok and r.usage for r in report.results)
        assert [r.request_id for r in report.results] == [
            f"conv-{c:02d}-turn-{t}" for c in range(2) for t in range(3)
        ]
        by_rid = {e["rid"]: e for e in recorder.seen}
        systems = {json.dumps(e["body"]["messages"][0]) for e in recorder.seen}
        assert len(systems) == 1  # one system message shared by every conversation
        for c in range(2):
            for t in range(3):
                entry = by_rid[f"conv-{c:02d}-turn-{t}"]
                assert entry["session"] == f"conv-{c:02d}"
                messages = entry["body"]["messages"]
                assert [m["role"] for m in messages] == [
                    "system",
                    *["user", "assistant"] * t,
                    "user",
                ]
                assert entry["body"]["stream"] is True and entry["body"]["max_tokens"] == 2
                if t:
                    before = by_rid[f"conv-{c:02d}-turn-{t - 1}"]["body"]["messages"]
                    assert messages[: len(before)] == before
                    assert messages[len(before)] == {
                        "role": "assistant",
                        "content": f"answer conv-{c:02d}-turn-{t - 1}",
                    }
        firsts = [by_rid[f"conv-{c:02d}-turn-0"]["body"]["messages"][1] for c in range(2)]
        assert firsts[0] != firsts[1]

    async def test_one_turn_at_a_time(self) -> None:
        """A conversation's next turn is sent only after the previous answer ended."""
        recorder = Recorder()
        async with serve(recorder.app()) as url:
            await run_conversations(spec(url, conversations=3))
        for position, entry in enumerate(recorder.seen):
            conv, _, turn = entry["rid"].rpartition("-turn-")
            if int(turn):
                earlier = [e for e in recorder.seen[:position] if e["rid"].startswith(conv)]
                assert len(earlier) == int(turn) and all(e["ended"] for e in earlier)

    async def test_a_failed_turn_ends_its_conversation(self) -> None:
        recorder = Recorder(fail="conv-01-turn-1")
        async with serve(recorder.app()) as url:
            report = await run_conversations(spec(url))
        errors = {r.request_id: r.error for r in report.results if not r.ok}
        assert errors == {"conv-01-turn-1": "status 500", "conv-01-turn-2": "earlier turn failed"}
        assert "conv-01-turn-2" not in {e["rid"] for e in recorder.seen}
        assert report.summary()["errors"] == 2 and report.summary()["ok"] == 4
        assert report.probe(spec("").index(1, 2)) is None

    async def test_probe_is_the_same_prompt_unary(self) -> None:
        recorder = Recorder()
        async with serve(recorder.app()) as url:
            report = await run_conversations(spec(url))
        path, body = report.probe(4)
        sent = report.bodies[4]
        assert path == "/v1/chat/completions"
        assert json.loads(body) == {
            **{k: v for k, v in sent.items() if k != "stream_options"},
            "stream": False,
            "max_tokens": 1,
        }


class TestAnswerText:
    """The content deltas of choice 0, whatever else the stream holds."""

    def test_deltas(self) -> None:
        data = (
            sse(
                {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                {
                    "choices": [
                        {"index": 0, "delta": {"content": "a"}},
                        {"index": 1, "delta": {"content": "x"}},
                    ]
                },
                {"choices": [{"index": 0, "delta": {"content": "b"}}]},
                {"choices": [], "usage": {"prompt_tokens": 3}},
            )
            + b"data: [DONE]\n\n"
        )
        assert conversations.answer_text(data) == "ab"


async def test_the_built_in_frontend_counts_a_growing_prompt(model_dirs: dict[str, Path]) -> None:
    """Each turn's prompt holds the previous one, its answer and the new message."""
    config = MockConfig(models={"deepseek": model_dirs["deepseek"]})
    async with serve_mock_frontend(config) as (url, _):
        report = await run_conversations(spec(url, output_tokens=8))
    assert all(r.ok for r in report.results)
    prompts = [r.usage["prompt_tokens"] for r in report.results]
    for c in range(2):
        turns = prompts[c * 3 : c * 3 + 3]
        assert turns[0] >= 40
        assert all(later > earlier + 8 + 10 for earlier, later in itertools.pairwise(turns))
