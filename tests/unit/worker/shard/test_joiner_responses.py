"""The joiner (no sockets) on Responses and batch completions: records per tap.

Hand-off messages are built with ``channel/handoff.py`` and fed to a ``Joiner``
with real tokenizers; the records are read back from the tap queues. Answers
are Dynamo 1.6.1's own bytes (``tests/data/dynamo/capture_responses.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shadow_proxy.channel.handoff import KEY, End, Head, Pieces, Request
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.records import wire
from shadow_proxy.records.envelope import check_envelope
from shadow_proxy.worker.main.tap_queue import TapQueue, TapQueues
from shadow_proxy.worker.request.tokenizer import load_model
from shadow_proxy.worker.shard.joiner import Joiner
from tests.support.servers import proxy_config

DATA = Path(__file__).resolve().parents[3] / "data" / "dynamo" / "responses"
SSE, JSON = "text/event-stream", "application/json"
JOINED, REQUESTS = "joined", "requests"
#: The prompts of the captured batch (``capture_responses.py``).
BATCH = {"model": "deepseek", "prompt": ["alpha beta", "gamma delta epsilon"], "max_tokens": 3}
#: The request of the captured ``stream_incomplete.sse`` and ``unary_incomplete.json``.
RESPONSES = {"model": "deepseek", "input": "Tell me about shadows.", "max_output_tokens": 5}


@pytest.fixture(scope="module")
def models(model_dirs) -> dict:
    return {name: load_model(name, str(path)) for name, path in model_dirs.items()}


def make_joiner(
    models: dict, *, joined: bool = True, max_in_flight: int | None = None, **request_tap: Any
) -> Joiner:
    taps = [{"name": REQUESTS, "capture": "request", **request_tap}]
    if joined:
        taps.append(
            {
                "name": JOINED,
                "capture": "request_response",
                "emit": "joined",
                "response": {"text": True},
            }
        )
    models_config = [{"name": name, "tokenizer": "unused"} for name in models]
    config = proxy_config("http://127.0.0.1:1", taps=taps, models=models_config)
    return Joiner(config, models, TapQueues(config.taps), max_in_flight=max_in_flight)


def exchange(
    joiner: Joiner,
    route: Route,
    body: dict,
    answer: bytes,
    *,
    ctype: str,
    key: int = 1,
    request_id: str = "rid-1",
    end: EndKind = EndKind.CLEAN,
    status: int = 200,
) -> None:
    """One request and its whole answer, in 3 chunks, as the serving loop hands them over."""
    k = KEY.pack(key)
    arrival = 1_700_000_000 * 10**9
    joiner.handle(Request(k, route, arrival, 10**9, 0, request_id, json.dumps(body).encode()))
    third = len(answer) // 3 + 1
    chunks = [answer[i : i + third] for i in range(0, len(answer), third)]
    offsets = [10 * (i + 1) for i in range(len(chunks))]
    joiner.handle(End(k, end, 10**6, Head(status, 5, ctype, ""), "", offsets, Pieces.of(chunks)))


def queue(joiner: Joiner, tap: str) -> TapQueue:
    assert isinstance(joiner.sink, TapQueues)
    return next(q for q in joiner.sink if q.name == tap)


def records(joiner: Joiner, tap: str) -> list[dict[str, Any]]:
    out = [wire.decode_envelope(payload) for payload in queue(joiner, tap).items]
    assert all(check_envelope(envelope) is None for envelope in out)
    return out


def metric(joiner: Joiner, name: str, **labels: str) -> float:
    return joiner.metrics.tally.get_sample_value(name, labels) or 0.0


class TestBatchRecords:
    """A batch completions request: one record per prompt and tap."""

    @pytest.mark.parametrize(
        ("fixture", "ctype", "stream"),
        [("batch_unary.json", JSON, False), ("batch_stream.sse", SSE, True)],
    )
    def test_one_record_per_prompt(self, models, fixture, ctype, stream) -> None:
        joiner = make_joiner(models)
        answer = (DATA / fixture).read_bytes()
        body = {**BATCH, "stream": stream}
        exchange(joiner, Route.COMPLETIONS, body, answer, ctype=ctype)
        plain, joined = records(joiner, REQUESTS), records(joiner, JOINED)
        for tap in (plain, joined):
            assert [r["prompt_index"] for r in tap] == [0, 1]
            assert [r["seq"] for r in tap] == [0, 1]
            assert {r["request_id"] for r in tap} == {"rid-1"}
            assert [r["request"]["token_ids"] for r in tap] == [
                models["deepseek"].encode(prompt) for prompt in BATCH["prompt"]
            ]
        usage = joined[0]["response"]["usage"]
        assert usage["prompt_tokens"] == sum(len(r["request"]["token_ids"]) for r in joined)
        assert sum(r["response"]["output_tokens"] for r in joined) == usage["completion_tokens"]
        texts = _texts_by_index(answer, stream)
        for index, record in enumerate(joined):
            response = record["response"]
            assert response["outcome"] == "complete"
            [choice] = response["choices"]
            assert (choice["index"], choice["finish_reason"]) == (0, "length")
            assert choice["text"] == texts[index]
        assert metric(joiner, "shadow_prompt_token_checks_total", model="deepseek") == 1
        assert metric(joiner, "shadow_prompt_token_mismatches_total", model="deepseek") == 0

    def test_the_check_compares_the_sum(self, models) -> None:
        joiner = make_joiner(models, joined=False)
        answer = (
            (DATA / "batch_unary.json")
            .read_bytes()
            .replace(b'"prompt_tokens":5', b'"prompt_tokens":4')
        )
        exchange(joiner, Route.COMPLETIONS, BATCH, answer, ctype=JSON)
        assert len(records(joiner, REQUESTS)) == 2
        assert metric(joiner, "shadow_prompt_token_checks_total", model="deepseek") == 1
        assert metric(joiner, "shadow_prompt_token_mismatches_total", model="deepseek") == 1

    def test_each_prompt_is_taken_on_its_own(self, models) -> None:
        """A filter that keeps prompts of at most 2 tokens keeps only prompt 0."""
        joiner = make_joiner(models, filters=["max-tokens=2"])
        answer = (DATA / "batch_unary.json").read_bytes()
        exchange(joiner, Route.COMPLETIONS, BATCH, answer, ctype=JSON)
        assert [r["prompt_index"] for r in records(joiner, REQUESTS)] == [0]
        assert [r["prompt_index"] for r in records(joiner, JOINED)] == [0, 1]
        assert queue(joiner, REQUESTS).skipped["max-tokens"] == 1

    def test_one_failed_choice_fails_its_prompt_only(self, models) -> None:
        body = json.loads((DATA / "batch_unary.json").read_bytes())
        body["choices"][1]["finish_reason"] = "error"
        joiner = make_joiner(models)
        exchange(joiner, Route.COMPLETIONS, BATCH, json.dumps(body).encode(), ctype=JSON)
        outcomes = [r["response"]["outcome"] for r in records(joiner, JOINED)]
        assert outcomes == ["complete", "error"]

    @pytest.mark.parametrize(
        ("end", "status", "tail", "outcome"),
        [
            (EndKind.CLIENT_GONE, 200, b"", "cancelled"),
            (EndKind.CLEAN, 503, b"", "error"),
            (EndKind.CLEAN, 200, b'\n\ndata: {"error": {"message": "worker died"}}\n\n', "error"),
        ],
    )
    def test_what_holds_for_the_whole_answer(self, models, end, status, tail, outcome) -> None:
        joiner = make_joiner(models)
        answer = (DATA / "batch_stream.sse").read_bytes()
        cut = answer[: answer.index(b"\n\n", 600)] + tail
        exchange(joiner, Route.COMPLETIONS, BATCH, cut, ctype=SSE, end=end, status=status)
        responses = [r["response"] for r in records(joiner, JOINED)]
        assert [r["outcome"] for r in responses] == [outcome] * 2
        if tail:
            assert [r["error"] for r in responses] == ["worker died"] * 2

    def test_n_choices_per_prompt(self, models) -> None:
        """Choice j of prompt i is the frontend's index i * n + j."""
        texts = {i: " word" * (i + 1) for i in range(4)}
        body = {
            "id": "cmpl-1",
            "object": "text_completion",
            "choices": [
                {"index": i, "text": texts[i], "finish_reason": "length"} for i in (3, 0, 2, 1)
            ],
        }
        joiner = make_joiner(models)
        exchange(
            joiner, Route.COMPLETIONS, {**BATCH, "n": 2}, json.dumps(body).encode(), ctype=JSON
        )
        choices = [r["response"]["choices"] for r in records(joiner, JOINED)]
        assert [[(c["index"], c["text"]) for c in cs] for cs in choices] == [
            [(0, texts[0]), (1, texts[1])],
            [(0, texts[2]), (1, texts[3])],
        ]
        counts = [[c["output_tokens"] for c in cs] for cs in choices]
        encode = models["deepseek"].encode
        assert counts == [[len(encode(texts[2 * i + j])) for j in (0, 1)] for i in (0, 1)]

    def test_eviction_drops_every_prompt(self, models) -> None:
        joiner = make_joiner(models, max_in_flight=0)
        joiner.handle(
            Request(KEY.pack(9), Route.COMPLETIONS, 1, 1, 0, "rid", json.dumps(BATCH).encode())
        )
        assert queue(joiner, JOINED).dropped["evicted"] == 2


def _texts_by_index(answer: bytes, stream: bool) -> dict[int, str]:
    if not stream:
        return {c["index"]: c["text"] for c in json.loads(answer)["choices"]}
    texts: dict[int, str] = {}
    for line in answer.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return texts


class TestResponsesRecords:
    """A Responses request: origin, prompt-token check against ``usage.input_tokens``."""

    @pytest.mark.parametrize(
        ("fixture", "ctype"), [("stream_incomplete.sse", SSE), ("unary_incomplete.json", JSON)]
    )
    def test_joined_record(self, models, fixture, ctype) -> None:
        joiner = make_joiner(models)
        answer = (DATA / fixture).read_bytes()
        exchange(joiner, Route.RESPONSES, RESPONSES, answer, ctype=ctype)
        [plain], [joined] = records(joiner, REQUESTS), records(joiner, JOINED)
        assert plain["origin"] == joined["origin"] == "responses"
        assert "prompt_index" not in joined
        response = joined["response"]
        assert response["usage"]["input_tokens"] == len(joined["request"]["token_ids"])
        assert response["output_tokens"] == response["usage"]["output_tokens"] == 5
        assert joined["request"]["stop_conditions"]["max_tokens"] == 5
        assert metric(joiner, "shadow_prompt_token_checks_total", model="deepseek") == 1
        assert metric(joiner, "shadow_prompt_token_mismatches_total", model="deepseek") == 0

    @pytest.mark.parametrize("joined", [True, False])
    def test_mismatch_is_counted(self, models, joined) -> None:
        """With joined taps from the parsed usage, without from the last chunks."""
        joiner = make_joiner(models, joined=joined)
        answer = (DATA / "stream_incomplete.sse").read_bytes()
        exchange(joiner, Route.RESPONSES, {**RESPONSES, "input": "Other words."}, answer, ctype=SSE)
        assert metric(joiner, "shadow_prompt_token_checks_total", model="deepseek") == 1
        assert metric(joiner, "shadow_prompt_token_mismatches_total", model="deepseek") == 1

    def test_not_rebuilt_is_counted(self, models) -> None:
        joiner = make_joiner(models)
        body = {**RESPONSES, "previous_response_id": "resp_1"}
        exchange(joiner, Route.RESPONSES, body, b"{}", ctype=JSON, status=501)
        assert records(joiner, REQUESTS) == records(joiner, JOINED) == []
        assert metric(joiner, "shadow_not_mirrored_total", reason="previous_response") == 1
