"""A record -> the candidate's completions request: every option in the field the
engine's frontend reads, checked by feeding the request back through the proxy's
own preprocessor (which reads requests the way Dynamo's frontend does)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.records.filters import FilterSet
from shadow_proxy.replay.request import (
    ORIGINAL_REQUEST_ID_HEADER,
    SKIP_REASONS,
    CandidateRequest,
    Skip,
    build_request,
)
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model

ARRIVAL_NS = 1_700_000_000_000_000_000


@pytest.fixture(scope="module")
def preprocessor(model_dirs: dict) -> Preprocessor:
    return Preprocessor({"deepseek": load_model("deepseek", str(model_dirs["deepseek"]))})


def record_of(pre: Preprocessor, route: Route, body: dict, **extra: Any) -> dict[str, Any]:
    """An envelope as a tap publishes it (default filters), with ``extra`` fields."""
    done = pre.preprocess(route, json.dumps(body).encode(), ARRIVAL_NS)
    request = FilterSet.parse([]).project(done)
    return {
        "schema_version": 1,
        "tap": "t",
        "seq": 0,
        "request_id": "rid-1",
        "origin": "chat" if route is Route.CHAT else "completions",
        "filters": [],
        "arrival_unix_ns": ARRIVAL_NS,
        "request": request,
        "response": {"outcome": "complete", "choices": [], "output_tokens": 0},
        **extra,
    }


CHAT = {
    "model": "deepseek",
    "messages": [{"role": "user", "content": "Tell me about shadows."}],
    "max_tokens": 33,
    "stop": ["\n\n", "END"],
    "min_tokens": 4,
    "top_k": 40,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.9,
    "presence_penalty": 0.2,
    "frequency_penalty": 0.3,
    "seed": 1234,
    "n": 2,
    "include_stop_str_in_output": True,
    "guided_regex": "[a-z ]+",
}


class TestRoundTrip:
    """What the candidate's frontend rebuilds from the request equals the record."""

    @pytest.mark.parametrize(
        "extra",
        [
            {},
            {"ignore_eos": True},
            {"top_k": 0},
            # (in nvext these are a 400 on Dynamo 1.6.1: not mirrored, so top level)
            {"top_k": 7, "repetition_penalty": 1.3, "ignore_eos": True},
            {"thinking_token_budget": 12, "guided_regex": None, "guided_choice": ["a", "b"]},
        ],
    )
    def test_chat_record_replays_as_the_engine_saw_it(
        self, preprocessor: Preprocessor, extra: dict
    ) -> None:
        body = {k: v for k, v in {**CHAT, **extra}.items() if v is not None}
        record = record_of(preprocessor, Route.CHAT, body)
        built = build_request(record)
        assert isinstance(built, CandidateRequest)
        again = preprocessor.preprocess(
            Route.COMPLETIONS, json.dumps(built.body).encode(), ARRIVAL_NS
        )
        replayed = FilterSet.parse([]).project(again)
        for key in ("model", "token_ids", "stop_conditions", "sampling_options", "eos_token_ids"):
            assert replayed[key] == record["request"][key], key
        assert built.body["prompt"] == record["request"]["token_ids"]

    def test_completions_logprobs_and_passthrough(self, preprocessor: Preprocessor) -> None:
        body = {
            "model": "deepseek",
            "prompt": "Once upon a time",
            "max_tokens": 5,
            "logprobs": 2,
            "allowed_token_ids": [1, 2, 3],
        }
        record = record_of(preprocessor, Route.COMPLETIONS, body)
        built = build_request(record)
        assert isinstance(built, CandidateRequest)
        assert built.body["logprobs"] == 2
        assert built.body["allowed_token_ids"] == [1, 2, 3]
        again = preprocessor.preprocess(
            Route.COMPLETIONS, json.dumps(built.body).encode(), ARRIVAL_NS
        )
        projected = FilterSet.parse([]).project(again)
        assert projected["output_options"] == record["request"]["output_options"]
        assert projected["extra_args"] == record["request"]["extra_args"]


class TestShape:
    """Streaming with usage, the request id header, the model override."""

    def test_stream_usage_header_and_model(self, preprocessor: Preprocessor) -> None:
        record = record_of(preprocessor, Route.CHAT, {**CHAT, "n": 1})
        built = build_request(record, model="other", request_id_header="x-req")
        assert isinstance(built, CandidateRequest)
        assert built.body["stream"] is True
        assert built.body["stream_options"] == {"include_usage": True}
        assert built.body["model"] == "other"
        assert built.request_id == "rid-1"
        assert built.prompt_tokens == len(record["request"]["token_ids"])
        # The candidate's own model card decides EOS; routing pins never travel.
        assert "stop_token_ids_hidden" not in built.body
        assert "nvext" not in built.body

    def test_each_target_its_own_request_id(self, preprocessor: Preprocessor) -> None:
        """Candidate and baseline never carry the same id (one deployment serving
        both refuses an id already in flight); the record's own id travels beside."""
        record = record_of(preprocessor, Route.CHAT, {**CHAT, "n": 1})
        built = build_request(record, request_id_header="x-req")
        assert isinstance(built, CandidateRequest)
        assert built.headers_for("candidate") == {
            "x-req": "rid-1-candidate",
            ORIGINAL_REQUEST_ID_HEADER: "rid-1",
        }
        assert built.headers_for("baseline") == {
            "x-req": "rid-1-baseline",
            ORIGINAL_REQUEST_ID_HEADER: "rid-1",
        }
        # Dynamo's deprecated header (it warns on every request) is not sent.
        assert "x-dynamo-request-id" not in built.headers_for("candidate")

    def test_false_and_default_options_are_not_sent(self, preprocessor: Preprocessor) -> None:
        body = {"model": "deepseek", "prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": False}
        built = build_request(record_of(preprocessor, Route.COMPLETIONS, body))
        assert isinstance(built, CandidateRequest)
        assert set(built.body) == {"model", "prompt", "stream", "stream_options", "max_tokens"}


class TestSkips:
    """Records that cannot be replayed get a reason from the fixed vocabulary."""

    def test_reasons(self, preprocessor: Preprocessor) -> None:
        good = record_of(preprocessor, Route.COMPLETIONS, {"model": "deepseek", "prompt": [1]})
        request_only = {k: v for k, v in good.items() if k != "response"}
        cases = {
            "invalid_record": {"request_id": "x"},
            "no_token_ids": {**good, "request": {**good["request"], "token_ids": []}},
            "multimodal": {
                **good,
                "request": {**good["request"], "multi_modal_data": {"image_url": ["u"]}},
            },
            "no_response": request_only,
        }
        for reason, record in cases.items():
            skip = build_request(record)
            assert skip == Skip(reason, record.get("request_id")), reason
        assert isinstance(build_request(request_only, compare=False), CandidateRequest)

    def test_vocabulary_is_closed(self) -> None:
        assert set(SKIP_REASONS) >= {"late", "no_response", "no_token_ids"}
        with pytest.raises(ValueError, match="'reason' must be one of"):
            Skip("whatever")
