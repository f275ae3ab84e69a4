"""Body fields as Dynamo 1.6.1 treats them (measured on the frontend with the
recording backend): what it refuses is not mirrored; what it accepts is filled
as it fills it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.fields import NotMirrored
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model

BASE = {"model": "chatml", "messages": [{"role": "user", "content": "hi"}]}
TOOLS = [
    {"type": "function", "function": {"name": "a", "parameters": {"properties": {"x": {}}}}},
    {"type": "function", "function": {"name": "b"}},
]


@pytest.fixture(scope="module")
def preprocessor(model_dirs: dict[str, Path]) -> Preprocessor:
    return Preprocessor({"chatml": load_model("chatml", str(model_dirs["chatml"]))})


def run(preprocessor: Preprocessor, body: dict, headers=()) -> PreprocessedRequest | NotMirrored:
    return preprocessor.preprocess(Route.CHAT, json.dumps(body).encode(), 0, headers)


class TestRefused:
    @pytest.mark.parametrize(
        "extra",
        [
            {"nvext": {"top_k": 3}},
            {"nvext": {"session_control": {"session_id": "s"}}},
            {"nvext": {"agent_context": {"session_id": "s"}}},
            {"nvext": {"router": {"session_id": "s"}}},
            {"nvext": {"routing_constraints": {"conversation_id": "c"}}},
            {"nvext": {"metadata_upload": {"a": {"b": 1}}}},
            {"agent_context": {"session_id": "s"}},
            {"session_id": "s"},
            {"allowed_token_ids": [2**64]},
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS},
        ],
    )
    def test_not_mirrored(self, preprocessor: Preprocessor, extra: dict) -> None:
        assert run(preprocessor, {**BASE, **extra}) == NotMirrored("invalid_field")

    def test_accepted_nvext(self, preprocessor: Preprocessor) -> None:
        nvext = {
            "router": {"ttft_target": 1.0},
            "metadata_upload": {"url": "http://x"},
            "routing_constraints": {"required_taints": ["t"]},
        }
        assert isinstance(run(preprocessor, {**BASE, "nvext": nvext}), PreprocessedRequest)


class TestFilled:
    def test_defaults_left_unset(self, preprocessor: Preprocessor) -> None:
        pre = run(preprocessor, BASE)
        assert "max_tokens" not in pre.stop_conditions
        assert pre.sampling_options == {}

    def test_sampling_floats_are_f32(self, preprocessor: Preprocessor) -> None:
        pre = run(preprocessor, {**BASE, "temperature": 0.7})
        assert pre.sampling_options["temperature"] == 0.699999988079071

    def test_tool_choice_guides_decoding(self, preprocessor: Preprocessor) -> None:
        named = {"type": "function", "function": {"name": "a"}}
        pre = run(preprocessor, {**BASE, "tools": TOOLS, "tool_choice": named})
        assert pre.sampling_options["guided_decoding"] == {"json": {"properties": {"x": {}}}}
        pre = run(preprocessor, {**BASE, "tools": TOOLS, "tool_choice": "required"})
        schema = pre.sampling_options["guided_decoding"]["json"]
        assert schema["type"] == "array"
        assert schema["minItems"] == 1
        names = [b["properties"]["name"]["enum"] for b in schema["items"]["anyOf"]]
        assert names == [["a"], ["b"]]
        pre = run(preprocessor, {**BASE, "tools": TOOLS, "tool_choice": "auto"})
        assert "guided_decoding" not in pre.sampling_options

    def test_tenant_header_beats_body_salt(self, preprocessor: Preprocessor) -> None:
        body = {**BASE, "nvext": {"cache_salt": "body"}, "cache_salt": "top"}
        assert run(preprocessor, body).routing["cache_salt"] == "body"
        pre = run(preprocessor, body, [("x-tenant-id", " tenant ")])
        assert pre.routing["cache_salt"] == pre.extra_args["nvext"]["cache_salt"] == "tenant"
        assert run(preprocessor, {**BASE, "cache_salt": "top"}).routing["cache_salt"] == "top"
