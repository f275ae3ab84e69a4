"""Stop conditions, sampling and output options, and nvext, as a Dynamo frontend fills them."""

from __future__ import annotations

import pytest

from shadow_proxy.exchange import Route
from shadow_proxy.worker.request import options
from shadow_proxy.worker.request.fields import NotMirrored, Reject
from tests.support.requests import (
    ARRIVAL_NS,
    CHAT_CASES,
    MODELS,
    run,
)


class TestStopConditions:
    """Stop conditions: max tokens rules, EOS ids hidden unless ignore_eos."""

    @pytest.mark.parametrize("model_name", MODELS)
    def test_max_tokens_omitted_stays_unset(self, preprocessor, loaded, model_name):
        # Dynamo 1.6.1 leaves max_tokens null when omitted (recording backend).
        result = run(preprocessor, Route.CHAT, {"model": model_name, **CHAT_CASES["tools"]})
        assert "max_tokens" not in result.stop_conditions

    def test_max_completion_tokens_wins_over_max_tokens(self, preprocessor):
        request = {"model": "chatml", **CHAT_CASES["single_turn"], "max_tokens": 9}
        assert run(preprocessor, Route.CHAT, request).stop_conditions["max_tokens"] == 9
        request["max_completion_tokens"] = 7
        assert run(preprocessor, Route.CHAT, request).stop_conditions["max_tokens"] == 7

    @pytest.mark.parametrize("model_name", MODELS)
    def test_eos_ids_hidden_stops(self, preprocessor, loaded, model_name):
        request = {
            "model": model_name,
            **CHAT_CASES["single_turn"],
            "stop": ["END"],
            "min_tokens": 2,
        }
        result = run(preprocessor, Route.CHAT, request)
        eos = list(loaded[model_name].eos_token_ids)
        assert result.eos_token_ids == eos
        assert result.stop_conditions == {
            "stop": ["END"],
            "stop_token_ids_hidden": eos,
            "min_tokens": 2,
        }

    def test_ignore_eos_drops_eos_and_stops(self, preprocessor):
        request = {"model": "chatml", **CHAT_CASES["single_turn"], "stop": "x", "ignore_eos": True}
        result = run(preprocessor, Route.CHAT, request)
        assert result.eos_token_ids == []
        assert result.stop_conditions["ignore_eos"] is True
        assert "stop_token_ids_hidden" not in result.stop_conditions
        assert "stop" not in result.stop_conditions


class TestSamplingAndOutput:
    """Sampling and output options are copied, with Dynamo's rewrites (top_k 0, logprobs true)."""

    def test_sampling_fields(self, preprocessor):
        request = {
            "model": "deepseek",
            **CHAT_CASES["single_turn"],
            "n": 2,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 0,
            "min_p": 0.1,
            "seed": 42,
            "presence_penalty": 0.25,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.1,
            "include_stop_str_in_output": True,
        }
        # Floats as the engine gets them: Dynamo keeps them as f32.
        assert run(preprocessor, Route.CHAT, request).sampling_options == {
            "n": 2,
            "temperature": 0.5,
            "top_p": 0.8999999761581421,
            "top_k": -1,
            "min_p": 0.10000000149011612,
            "seed": 42,
            "presence_penalty": 0.25,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.100000023841858,
            "include_stop_str_in_output": True,
        }

    def test_unset_sampling_has_only_the_serde_default(self, preprocessor):
        result = run(preprocessor, Route.CHAT, {"model": "deepseek", **CHAT_CASES["single_turn"]})
        assert result.sampling_options == {}
        assert result.output_options == {}

    def test_chat_logprobs_true_means_top_logprobs_or_one(self, preprocessor):
        request = {"model": "chatml", **CHAT_CASES["single_turn"], "logprobs": True}
        assert run(preprocessor, Route.CHAT, request).output_options == {"logprobs": 1}
        request["top_logprobs"] = 5
        assert run(preprocessor, Route.CHAT, request).output_options == {"logprobs": 5}
        request["logprobs"] = False
        assert run(preprocessor, Route.CHAT, request).output_options == {}

    def test_completions_logprobs_and_echo(self, preprocessor):
        request = {"model": "chatml", "prompt": "hi", "logprobs": 3, "echo": True, "best_of": 2}
        result = run(preprocessor, Route.COMPLETIONS, request)
        assert result.output_options == {"logprobs": 3, "prompt_logprobs": 1}
        assert result.sampling_options["best_of"] == 2

    def test_guided_decoding_from_response_format_and_fields(self, preprocessor):
        base = {"model": "chatml", **CHAT_CASES["single_turn"]}
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        result = run(preprocessor, Route.CHAT, {**base, "response_format": fmt})
        assert result.sampling_options["guided_decoding"] == {"json": schema}
        result = run(preprocessor, Route.CHAT, {**base, "response_format": {"type": "json_object"}})
        assert result.sampling_options["guided_decoding"] == {"json": {"type": "object"}}
        result = run(preprocessor, Route.CHAT, {**base, "guided_regex": "[ab]+"})
        assert result.sampling_options["guided_decoding"] == {"regex": "[ab]+"}
        both = {**base, "guided_regex": "a", "guided_choice": ["x", "y"]}
        assert run(preprocessor, Route.CHAT, both) == NotMirrored("invalid_field")

    def test_greedy_nvext_clears_temperature_and_top_p(self, preprocessor):
        request = {
            "model": "chatml",
            **CHAT_CASES["single_turn"],
            "temperature": 0.7,
            "top_p": 0.5,
            "nvext": {"greed_sampling": True},
        }
        options = run(preprocessor, Route.CHAT, request).sampling_options
        assert "temperature" not in options
        assert "top_p" not in options


class TestNvext:
    """nvext fills annotations, routing, extra_args, agent context and the timestamp."""

    def test_nvext_fields(self, preprocessor):
        request = {
            "model": "deepseek",
            **CHAT_CASES["single_turn"],
            "nvext": {
                "annotations": ["formatted_prompt"],
                "backend_instance_id": 7,
                "prefill_worker_id": 8,
                "decode_worker_id": 9,
                "dp_rank": 1,
                "prefill_dp_rank": 0,
                "agent_hints": {"osl": 64, "priority": 3, "strict_priority": 1},
                "extra_fields": ["timing"],
                "cache_salt": "tenant-a",
                "request_timestamp_ms": 1234.5,
                "max_thinking_tokens": 100,
            },
        }
        result = run(preprocessor, Route.CHAT, request)
        assert result.annotations == ["formatted_prompt"]
        assert result.routing == {
            "backend_instance_id": 7,
            "prefill_worker_id": 8,
            "decode_worker_id": 9,
            "dp_rank": 1,
            "prefill_dp_rank": 0,
            "expected_output_tokens": 64,
            "priority_jump": 3.0,
            "strict_priority": 1,
            "priority": 3,
            "cache_salt": "tenant-a",
        }
        assert result.extra_args == {
            "nvext": {"extra_fields": ["timing"], "cache_salt": "tenant-a"}
        }
        assert result.agent_context == {}  # only session headers fill it (1.6.1)
        assert result.request_timestamp_ms == 1234.5
        assert result.stop_conditions["max_thinking_tokens"] == 100

    def test_without_nvext_the_nested_fields_are_empty(self, preprocessor):
        result = run(preprocessor, Route.CHAT, {"model": "deepseek", **CHAT_CASES["single_turn"]})
        assert (result.routing, result.extra_args, result.agent_context) == ({}, {}, {})
        assert result.annotations == []
        assert result.request_timestamp_ms == ARRIVAL_NS // 1_000_000

    def test_token_data_replaces_tokenization(self, preprocessor):
        request = {"model": "chatml", **CHAT_CASES["single_turn"], "nvext": {"token_data": [5, 6]}}
        result = run(preprocessor, Route.CHAT, request)
        assert result.token_ids == [5, 6]
        assert result.extra_args == {"nvext": {"token_in": True}}


class TestDirect:
    """The option functions called directly: top-level fields win over nvext."""

    def test_stop_conditions(self) -> None:
        request = {
            "max_tokens": 9,
            "max_completion_tokens": 4,
            "stop": "x",
            "ignore_eos": False,
            "min_tokens": 2,
        }
        nvext = {"ignore_eos": True, "max_thinking_tokens": 50}
        assert options.stop_conditions(request, nvext, chat=True) == {
            "max_tokens": 4,
            "stop": ["x"],
            "stop_token_ids": None,
            "min_tokens": 2,
            "ignore_eos": False,
            "max_thinking_tokens": 50,
        }
        completions = options.stop_conditions(request, {}, chat=False)
        assert completions["max_tokens"] == 9  # max_completion_tokens is chat only

    def test_stop_token_ids_only_for_chat(self) -> None:
        assert options.stop_conditions({"stop": [5, 6]}, {}, chat=True)["stop_token_ids"] == [5, 6]
        with pytest.raises(Reject, match="invalid_field"):
            options.stop_conditions({"stop": [5, 6]}, {}, chat=False)
