"""The join, without sockets: hand-off messages in (``channel.handoff``), records
out into an in-process sink (``TapQueues``). Every request a tap takes gets
exactly one record or one counted drop, whatever the response does."""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
import pytest

from shadow_proxy.channel import headers as engine_headers
from shadow_proxy.channel.handoff import KEY, Chunks, End, Head, Pieces, Request
from shadow_proxy.config import Config
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.records import wire
from shadow_proxy.worker.main.tap_queue import TapQueue, TapQueues
from shadow_proxy.worker.request.incremental import IncrementalEncoder
from shadow_proxy.worker.request.tokenizer import LoadedModel
from shadow_proxy.worker.shard.joiner import Joiner
from tests.support.client import chat_body
from tests.support.servers import proxy_config

ARRIVAL_NS = 1_700_000_000_000_000_000


def config(*taps: dict[str, Any], **options: Any) -> Config:
    endpoints = [dict(tap, endpoint=f"inproc://{tap['name']}") for tap in taps]
    models = {"deepseek": "/unused", "chatml": "/unused"}  # only deepseek is loaded
    return proxy_config("http://127.0.0.1:9", models=models, taps=endpoints, **options)


REQUEST_TAP = {"name": "kv", "capture": "request"}
JOINED_TAP = {"name": "replay", "capture": "request_response", "response": {"text": True}}


def joiner_for(cfg: Config, models: dict[str, LoadedModel]) -> Joiner:
    return Joiner(cfg, models, TapQueues(cfg.taps))


def key(n: int) -> bytes:
    return KEY.pack(n)


def request(n: int, body: dict[str, Any], *, rid: str = "", headers: bytes = b"") -> Request:
    return Request(
        key(n),
        Route.CHAT,
        ARRIVAL_NS,
        time.monotonic_ns(),
        0,
        rid or f"req-{n}",
        json.dumps(body).encode(),
        headers,
    )


def event(content: str | None = None, finish: str | None = None, **extra: Any) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


HEAD = Head(200, 1_000, "text/event-stream", "")


def chunks(n: int, data: list[bytes], head: Head | None = None) -> Chunks:
    return Chunks(key(n), head, [2_000 + i for i in range(len(data))], Pieces.of(data))


def end(
    n: int,
    data: list[bytes],
    kind: EndKind = EndKind.CLEAN,
    head: Head | None = None,
    detail: str = "",
) -> End:
    return End(
        key(n), kind, 9_000, head, detail, [5_000 + i for i in range(len(data))], Pieces.of(data)
    )


def queue(joiner: Joiner, tap: str) -> TapQueue:
    assert isinstance(joiner.sink, TapQueues)
    return next(q for q in joiner.sink if q.name == tap)


def records(joiner: Joiner, tap: str) -> list[dict[str, Any]]:
    return [wire.decode_envelope(item) for item in queue(joiner, tap).items]


@pytest.fixture
def models(loaded: dict[str, LoadedModel]) -> dict[str, LoadedModel]:
    return {"deepseek": loaded["deepseek"]}


class TestJoin:
    """A request tap is offered at the request; a joined tap at the end, once."""

    def test_request_then_joined_record(self, models) -> None:
        joiner = joiner_for(config(REQUEST_TAP, JOINED_TAP), models)
        joiner.handle(request(1, chat_body(), rid="client-id"))
        [kv] = records(joiner, "kv")
        assert (kv["tap"], kv["seq"], kv["request_id"], kv["origin"]) == (
            "kv",
            0,
            "client-id",
            "chat",
        )
        assert kv["arrival_unix_ns"] == ARRIVAL_NS and "response" not in kv
        assert records(joiner, "replay") == []  # waits for the response
        joiner.handle(chunks(1, [event("Hel"), event("lo")], head=HEAD))
        joiner.handle(end(1, [event(finish="length"), b"data: [DONE]\n\n"]))
        [replay] = records(joiner, "replay")
        response = replay["response"]
        assert (response["outcome"], response["http_status"]) == ("complete", 200)
        assert response["choices"][0]["text"] == "Hello"
        assert replay["request"]["token_ids"] == kv["request"]["token_ids"]
        assert joiner.pending == {}

    def test_chunks_of_an_unknown_request_are_ignored(self, models) -> None:
        joiner = joiner_for(config(JOINED_TAP), models)
        joiner.handle(chunks(7, [event("x")], head=HEAD))
        joiner.handle(end(7, []))
        assert records(joiner, "replay") == [] and queue(joiner, "replay").next_seq == 0

    def test_a_request_not_mirrored_takes_no_seq(self, models) -> None:
        joiner = joiner_for(config(REQUEST_TAP), models)
        joiner.handle(request(1, chat_body(model="unlisted")))
        joiner.handle(request(2, chat_body()))
        assert [r["seq"] for r in records(joiner, "kv")] == [0]
        reasons = joiner.metrics.tally.get_sample_value
        assert reasons("shadow_not_mirrored_total", {"reason": "unknown_model"}) == 1

    def test_a_tap_for_other_models_skips(self, models) -> None:
        joiner = joiner_for(
            config(REQUEST_TAP, {**REQUEST_TAP, "name": "other", "models": ["chatml"]}), models
        )
        joiner.handle(request(1, chat_body()))
        assert len(records(joiner, "kv")) == 1
        assert records(joiner, "other") == [] and queue(joiner, "other").skipped == {"models": 1}


class TestLosses:
    """What cannot be recorded is dropped with its reason, its seq taken."""

    def test_a_lost_capture_drops_the_joined_record(self, models) -> None:
        joiner = joiner_for(config(REQUEST_TAP, JOINED_TAP), models)
        joiner.handle(request(1, chat_body()))
        joiner.handle(end(1, [], kind=EndKind.CAPTURE_LOST))
        assert records(joiner, "replay") == []
        assert queue(joiner, "replay").dropped["handoff_full"] == 1
        assert queue(joiner, "replay").next_seq == 1
        assert len(records(joiner, "kv")) == 1

    def test_the_oldest_open_request_is_evicted(self, models) -> None:
        joiner = joiner_for(config(JOINED_TAP, worker={"max_in_flight": 1}), models)
        joiner.handle(request(1, chat_body()))
        joiner.handle(request(2, chat_body()))
        assert list(joiner.pending) == [key(2)]
        assert queue(joiner, "replay").dropped["evicted"] == 1
        assert joiner.metrics.tally.get_sample_value("shadow_worker_evicted_total") == 1
        joiner.handle(end(1, [event("late", finish="length")], head=HEAD))  # gone: ignored
        assert records(joiner, "replay") == []

    def test_open_requests_get_a_shutdown_record(self, models) -> None:
        joiner = joiner_for(config(JOINED_TAP), models)
        joiner.handle(request(1, chat_body()))
        joiner.handle(chunks(1, [event("Hi")], head=HEAD))
        joiner.finish_pending()
        [record] = records(joiner, "replay")
        assert record["response"]["outcome"] == "error"
        assert record["response"]["error"] == "proxy shut down"
        assert joiner.pending == {}


class TestPromptTokenCheck:
    """The rebuilt prompt length is compared with the frontend's ``usage``."""

    @pytest.mark.parametrize("joined", [True, False], ids=["joined-tap", "tail-only"])
    @pytest.mark.parametrize("offset", [0, 1], ids=["equal", "differs"])
    def test_checked(self, models, joined: bool, offset: int) -> None:
        joiner = joiner_for(config(JOINED_TAP if joined else REQUEST_TAP), models)
        joiner.handle(request(1, chat_body()))
        prompt = joiner.pending[key(1)].prompt_tokens
        usage = {"prompt_tokens": prompt + offset, "completion_tokens": 1, "total_tokens": 9}
        joiner.handle(end(1, [event("a", finish="length"), event(usage=usage)], head=HEAD))
        value = joiner.metrics.tally.get_sample_value
        assert value("shadow_prompt_token_checks_total", {"model": "deepseek"}) == 1
        mismatches = value("shadow_prompt_token_mismatches_total", {"model": "deepseek"})
        assert (mismatches or 0) == offset

    def test_without_usage_nothing_is_checked(self, models) -> None:
        joiner = joiner_for(config(REQUEST_TAP), models)
        joiner.handle(request(1, chat_body()))
        joiner.handle(end(1, [event("a", finish="length")], head=HEAD))
        value = joiner.metrics.tally.get_sample_value
        assert value("shadow_prompt_token_checks_total", {"model": "deepseek"}) is None


class TestAnswersKept:
    """A chat request that names its session is a conversation: the ids the worker
    encodes for its answer are kept for the next turn, which resends the answer.
    ChatML wraps it ("assistant\\n" before it), so keeping is a second encode, not
    done without a session."""

    @pytest.fixture
    def chatml(self, loaded: dict[str, LoadedModel]) -> dict[str, LoadedModel]:
        model = loaded["chatml"]
        encoder = IncrementalEncoder.for_tokenizer(model.backend)
        encoder.learn_answer_gap(model.chat_template.render)
        return {"chatml": attrs.evolve(model, prompt_encoder=encoder)}

    @pytest.mark.parametrize(("session", "kept"), [(True, True), (False, False)])
    def test_kept_only_for_a_conversation(self, chatml, session, kept) -> None:
        tokens = {**JOINED_TAP, "response": {"tokens": True}}
        joiner = joiner_for(config(tokens), chatml)
        headers = engine_headers.pick([(b"x-dynamo-session-id", b"conv-1")]) if session else b""
        joiner.handle(request(1, chat_body(model="chatml"), headers=headers))
        joiner.handle(chunks(1, [event("The answer"), event(" is 42.")], head=HEAD))
        joiner.handle(end(1, [event(finish="stop"), b"data: [DONE]\n\n"]))
        [replay] = records(joiner, "replay")
        assert replay["response"]["outcome"] == "complete"
        cache = chatml["chatml"].prompt_encoder.cache
        assert (cache.get("assistant\nThe answer is 42.") is not None) is kept


class TestCutResponses:
    """A response read no further past a work budget is not encoded either (its text
    can be megabytes of a bomb): counts come from content chunks, no token ids."""

    def test_cut_by_the_events_bound(self, models) -> None:
        tokens = {**JOINED_TAP, "response": {"tokens": True, "text": True}}
        joiner = joiner_for(config(tokens), models)
        joiner.handle(request(1, chat_body()))  # max_tokens 4: 4 x 4 + 256 events
        joiner.handle(chunks(1, [event("word ")] * 300, head=HEAD))
        joiner.handle(end(1, [event(finish="length"), b"data: [DONE]\n\n"]))
        [replay] = records(joiner, "replay")
        response = replay["response"]
        assert response["outcome"] == "incomplete" and "events" in response["error"]
        [choice] = response["choices"]
        assert "token_ids" not in choice and choice["truncated"] is True
        assert choice["output_tokens"] == 272  # content chunks read
        assert response["output_tokens_source"] == "chunks"
        assert "token_ids_source" not in response

    def test_whole_responses_are_encoded(self, models) -> None:
        tokens = {**JOINED_TAP, "response": {"tokens": True}}
        joiner = joiner_for(config(tokens), models)
        joiner.handle(request(1, chat_body()))
        joiner.handle(chunks(1, [event("word ")] * 4, head=HEAD))
        joiner.handle(end(1, [event(finish="length"), b"data: [DONE]\n\n"]))
        [replay] = records(joiner, "replay")
        [choice] = replay["response"]["choices"]
        assert choice["token_ids"] and replay["response"]["token_ids_source"] == "retokenized"
