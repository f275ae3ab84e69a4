"""A failure while projecting or encoding for one tap costs that tap one counted
drop and nothing else (issue 18 item 3)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shadow_proxy.channel.handoff import KEY, Request
from shadow_proxy.config import Config
from shadow_proxy.exchange import Route
from shadow_proxy.worker.main.tap_queue import TapQueues
from shadow_proxy.worker.request.tokenizer import load_model
from shadow_proxy.worker.shard.joiner import Joiner


@pytest.fixture(scope="module")
def joiner_factory(model_dirs: dict[str, Path]):
    model = load_model("chatml", str(model_dirs["chatml"]))

    def make() -> Joiner:
        taps = [
            {
                "name": name,
                "capture": "request",
                "endpoint": f"tcp://127.0.0.1:{5900 + i}",
                "filters": filters,
            }
            for i, (name, filters) in enumerate(
                [
                    ("first", []),
                    ("private", ["strip-agent-context"]),
                    ("last", []),
                    ("lean", ["tokens-only"]),
                ]
            )
        ]
        config = Config.from_mapping(
            {
                "schema_version": 1,
                "upstream": {"url": "http://127.0.0.1:1"},
                "models": [{"name": "chatml", "tokenizer": str(model_dirs["chatml"])}],
                "taps": taps,
            }
        )
        return Joiner(config, {"chatml": model}, TapQueues(config.taps))

    return make


def hand_over(joiner: Joiner, body: dict, key: int = 1) -> None:
    now = time.time_ns(), time.monotonic_ns()
    joiner.handle(Request(KEY.pack(key), Route.CHAT, *now, 0, "rid-1", json.dumps(body).encode()))


def nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth):
        value = [value]
    return value


class TestIsolation:
    def test_projection_failure_costs_one_tap(self, joiner_factory) -> None:
        """Nested past what the session-key strip walks (128 levels, as Dynamo's
        parser takes): that tap loses the record, counted, its seq taken; the
        taps that copy the field as it is, or drop it, keep it."""
        joiner = joiner_factory()
        body = {
            "model": "chatml",
            "messages": [{"role": "user", "content": "x"}],
            "bad_words_token_ids": nested(200),
        }
        hand_over(joiner, body)
        first, private, last, lean = joiner.sink
        assert [len(q.items) for q in (first, private, last, lean)] == [1, 0, 1, 1]
        assert private.dropped["projection_error"] == 1
        assert private.next_seq == 1  # the seq is taken: a consumer sees the gap
        assert not any(q.dropped.get("projection_error") for q in (first, last, lean))

    def test_what_dynamo_accepts_reaches_every_tap(self, joiner_factory) -> None:
        """100 levels (Dynamo's parser takes 128): every tap, the strip's too (at a
        64-level strip the strip-agent-context tap lost it)."""
        joiner = joiner_factory()
        body = {
            "model": "chatml",
            "messages": [{"role": "user", "content": "x"}],
            "bad_words_token_ids": nested(100),
        }
        hand_over(joiner, body)
        assert [len(q.items) for q in joiner.sink] == [1, 1, 1, 1]

    def test_lone_surrogate_body_not_mirrored_as_the_frontend_refuses_it(self, joiner_factory):
        joiner = joiner_factory()
        raw = (
            b'{"model": "chatml", "messages": [{"role": "user", "content": "x"}],'
            b' "stop": ["a\\ud800"]}'
        )
        now = time.time_ns(), time.monotonic_ns()
        joiner.handle(Request(KEY.pack(2), Route.CHAT, *now, 0, "rid-2", raw))
        assert all(len(queue.items) == 0 for queue in joiner.sink)
        assert joiner.metrics.not_mirrored.labels("invalid_json").value == 1
