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
                [("first", []), ("private", ["strip-agent-context"]), ("last", [])]
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
        joiner = joiner_factory()
        body = {
            "model": "chatml",
            "messages": [{"role": "user", "content": "x"}],
            "bad_words_token_ids": nested(100),  # deeper than the projection walks
        }
        hand_over(joiner, body)
        first, private, last = joiner.sink
        assert (len(first.items), len(private.items), len(last.items)) == (1, 0, 1)
        assert private.dropped["projection_error"] == 1
        assert private.next_seq == 1  # the seq is taken: a consumer sees the gap
        assert first.dropped["projection_error"] == last.dropped["projection_error"] == 0

    def test_lone_surrogate_body_not_mirrored_as_the_frontend_refuses_it(self, joiner_factory):
        joiner = joiner_factory()
        raw = (
            b'{"model": "chatml", "messages": [{"role": "user", "content": "x"}],'
            b' "stop": ["a\\ud800"]}'
        )
        now = time.time_ns(), time.monotonic_ns()
        joiner.handle(Request(KEY.pack(2), Route.CHAT, *now, 0, "rid-2", raw))
        assert all(len(queue.items) == 0 for queue in joiner.sink)
        assert joiner.metrics.not_mirrored.labels("invalid_json")._value.get() == 1
