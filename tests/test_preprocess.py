"""Preprocessing: OpenAI request bytes -> Dynamo's preprocessed request, on two real tokenizers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow_proxy.devtools import modeldirs
from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.fields import NOT_MIRRORED_REASONS, NotMirrored
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import ModelLoadError, checksum, load_model

ARRIVAL_NS = 1_700_000_000_123_456_789
MODELS = ("deepseek", "chatml")


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two model directories: the repo's .models if built, else built under tmp."""
    root = Path(__file__).resolve().parent.parent / ".models"
    if not all((root / name / "generation_config.json").exists() for name in MODELS):
        root = tmp_path_factory.mktemp("models")
    return modeldirs.build_all(root)


@pytest.fixture(scope="session")
def loaded(model_dirs: dict[str, Path]) -> dict:
    # These cases compare with transformers' apply_chat_template: jinja2's view.
    # Dynamo's MiniJinja view is tested in tests/unit/worker/request/templates/.
    return {
        name: load_model(name, str(path), None, template_engine="jinja2")
        for name, path in model_dirs.items()
    }


@pytest.fixture(scope="session")
def preprocessor(loaded: dict) -> Preprocessor:
    return Preprocessor(loaded)


def run(pre: Preprocessor, route: Route, request: object) -> PreprocessedRequest | NotMirrored:
    return pre.preprocess(route, json.dumps(request).encode(), ARRIVAL_NS)


def dynamo_messages(messages: list[dict]) -> list[dict]:
    """The message rewrites Dynamo's frontend makes before templating (seen on the
    real frontend): all-text part lists joined by newlines, tool-call arguments
    parsed from JSON."""
    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list) and all(p["type"] == "text" for p in content):
            message["content"] = "\n".join(p["text"] for p in content)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


def expected_chat_ids(model, request: dict) -> list[int]:
    """Token ids worked out by the tokenizer's own apply_chat_template, on the
    messages as Dynamo rewrites them."""
    tools = None if request.get("tool_choice") == "none" else request.get("tools")
    out = model.tokenizer.apply_chat_template(
        dynamo_messages(request["messages"]),
        tools=tools,
        tokenize=True,
        add_generation_prompt=True,
        **request.get("chat_template_kwargs", {}),
    )
    return list(out["input_ids"]) if not isinstance(out, list) else out


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

CHAT_CASES = {
    "single_turn": {"messages": [{"role": "user", "content": "Hello there"}]},
    "system_multi_turn": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ]
    },
    "tools": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [WEATHER_TOOL],
    },
    "tool_choice_none": {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "none",
    },
    "digits": {"messages": [{"role": "user", "content": "call 0123456789 or 42, x1y22"}]},
    "unicode_emoji": {"messages": [{"role": "user", "content": "héllo 日本語 😀🚀 — naïve café"}]},
    "empty_content": {"messages": [{"role": "user", "content": ""}]},
    "list_of_parts": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe "},
                    {"type": "text", "text": "this."},
                ],
            }
        ]
    },
    "thinking_off": {
        "messages": [{"role": "user", "content": "quick answer"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
}


class TestChatTokens:
    """Chat token ids equal the tokenizer's own apply_chat_template with the generation prompt."""

    @pytest.mark.parametrize("model_name", MODELS)
    @pytest.mark.parametrize("case", sorted(CHAT_CASES))
    def test_ids_match_apply_chat_template(self, preprocessor, loaded, model_name, case):
        request = {"model": model_name, **CHAT_CASES[case]}
        result = run(preprocessor, Route.CHAT, request)
        assert isinstance(result, PreprocessedRequest), result
        assert result.token_ids == expected_chat_ids(loaded[model_name], request)
        assert result.model == model_name

    def test_thinking_switch_changes_the_chatml_prompt(self, preprocessor):
        base = {"model": "chatml", "messages": [{"role": "user", "content": "hi"}]}
        plain = run(preprocessor, Route.CHAT, base)
        off = run(
            preprocessor, Route.CHAT, {**base, "chat_template_kwargs": {"enable_thinking": False}}
        )
        assert len(off.token_ids) > len(plain.token_ids)

    def test_generation_prompt_is_added(self, preprocessor, loaded):
        result = run(preprocessor, Route.CHAT, {"model": "deepseek", **CHAT_CASES["single_turn"]})
        assert loaded["deepseek"].tokenizer.decode(result.token_ids).endswith("<｜Assistant｜>")

    def test_nul_characters_are_stripped_before_encoding(self, preprocessor):
        with_nul = {"model": "chatml", "messages": [{"role": "user", "content": "a\0b"}]}
        without = {"model": "chatml", "messages": [{"role": "user", "content": "ab"}]}
        assert run(preprocessor, Route.CHAT, with_nul).token_ids == (
            run(preprocessor, Route.CHAT, without).token_ids
        )


class TestModelLoading:
    """Loading reads EOS ids, context length and a stable checksum from the model directory."""

    def test_eos_ids_are_the_ordered_union(self, loaded):
        assert loaded["deepseek"].eos_token_ids == (1,)
        tok = loaded["chatml"].tokenizer
        ids = (tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>"))
        assert loaded["chatml"].eos_token_ids == ids

    def test_context_length_from_config_unless_given(self, model_dirs, loaded):
        assert loaded["deepseek"].context_length == modeldirs.DEEPSEEK_CONTEXT_LENGTH
        assert loaded["chatml"].context_length == modeldirs.CHATML_CONTEXT_LENGTH
        assert load_model("c", str(model_dirs["chatml"]), 100).context_length == 100

    def test_checksum_is_stable_and_differs_between_models(self, model_dirs, loaded):
        assert loaded["chatml"].mdc_sum == checksum(model_dirs["chatml"])
        assert len(loaded["chatml"].mdc_sum) == 16
        assert loaded["chatml"].mdc_sum != loaded["deepseek"].mdc_sum

    def test_missing_directory_says_so_without_network(self, tmp_path):
        with pytest.raises(ModelLoadError, match="absent for model 'm' does not exist"):
            load_model("m", str(tmp_path / "absent"), None)
        with pytest.raises(ModelLoadError, match="point `tokenizer` at a local"):
            load_model("m", "no-such-org/no-such-model", None)


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


class TestMultimodal:
    """Media parts of user messages become URL references; text parts still render."""

    def test_media_urls(self, preprocessor, loaded):
        request = {
            "model": "chatml",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look:"},
                        {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                        {"type": "audio_url", "audio_url": {"url": "https://x/a.wav"}},
                    ],
                }
            ],
        }
        result = run(preprocessor, Route.CHAT, request)
        assert result.multi_modal_data == {
            "image_url": [{"Url": "https://x/a.png"}, {"Url": "data:image/png;base64,AA=="}],
            "audio_url": [{"Url": "https://x/a.wav"}],
        }
        assert result.token_ids == expected_chat_ids(loaded["chatml"], request)
        assert "max_tokens" not in result.stop_conditions  # left to the engine, as Dynamo

    def test_prompt_embeds(self, preprocessor):
        result = run(preprocessor, Route.COMPLETIONS, {"model": "chatml", "prompt_embeds": "AAAA"})
        assert result.token_ids == []
        assert result.multi_modal_data == {"prompt_embeds": "AAAA"}
        assert result.has_multimodal


class TestCompletions:
    """Completions: a string is encoded as is, ids are used as given, batches are not mirrored."""

    @pytest.mark.parametrize("model_name", MODELS)
    def test_string_prompt_without_special_tokens(self, preprocessor, loaded, model_name):
        prompt = "Once upon a time 😀"
        result = run(preprocessor, Route.COMPLETIONS, {"model": model_name, "prompt": prompt})
        tokenizer = loaded[model_name].tokenizer
        assert result.token_ids == tokenizer.encode(prompt, add_special_tokens=False)
        assert "max_tokens" not in result.stop_conditions

    @pytest.mark.parametrize(
        ("prompt", "ids"),
        [([3, 4, 5], [3, 4, 5]), ([[3, 4]], [3, 4])],
    )
    def test_token_prompts(self, preprocessor, prompt, ids):
        result = run(preprocessor, Route.COMPLETIONS, {"model": "chatml", "prompt": prompt})
        assert result.token_ids == ids

    def test_one_element_string_list(self, preprocessor, loaded):
        result = run(preprocessor, Route.COMPLETIONS, {"model": "deepseek", "prompt": ["abc def"]})
        expected = loaded["deepseek"].tokenizer.encode("abc def", add_special_tokens=False)
        assert result.token_ids == expected

    def test_batches_are_one_request_per_prompt(self, preprocessor):
        # (issue 16; the batch rules are tested in tests/unit/worker/request/test_batch.py)
        result = run(preprocessor, Route.COMPLETIONS, {"model": "chatml", "prompt": [[1], [2]]})
        assert [r.token_ids for r in result.requests] == [[1], [2]]

    def test_prompt_filling_the_context_is_mirrored(self, preprocessor):
        # The frontend decides (a 400, or served): the record shows which.
        request = {"model": "chatml", "prompt": [1] * modeldirs.CHATML_CONTEXT_LENGTH}
        result = run(preprocessor, Route.COMPLETIONS, request)
        assert len(result.token_ids) == modeldirs.CHATML_CONTEXT_LENGTH


class TestNotMirrored:
    """Bad input yields a NotMirrored with a fixed reason, never an exception."""

    @pytest.mark.parametrize(
        ("route", "body", "reason"),
        [
            (Route.CHAT, b"\xff\xfe", "non_utf8"),
            (Route.CHAT, b"{", "invalid_json"),
            (Route.CHAT, b'{"model": NaN}', "invalid_json"),
            (Route.CHAT, b"[1]", "not_an_object"),
            (Route.CHAT, b"{}", "missing_model"),
            (Route.CHAT, b'{"model": "gpt-x", "messages": []}', "unknown_model"),
            (Route.CHAT, b'{"model": "chatml"}', "missing_messages"),
            (Route.CHAT, b'{"model": "chatml", "messages": []}', "missing_messages"),
            (Route.CHAT, b'{"model": "chatml", "messages": 5}', "invalid_field"),
            (Route.COMPLETIONS, b'{"model": "chatml"}', "missing_prompt"),
            (Route.MODELS, b"{}", "unsupported_route"),
        ],
    )
    def test_reasons(self, preprocessor, route, body, reason):
        assert preprocessor.preprocess(route, body, ARRIVAL_NS) == NotMirrored(reason)

    @pytest.mark.parametrize(
        "field",
        [
            {"temperature": "hot"},
            {"n": "2"},
            {"n": True},
            {"max_tokens": -1},
            {"top_k": 1.5},
            {"logprobs": 1},
            {"stop": 5},
            {"nvext": []},
            {"nvext": {"backend_instance_id": "7"}},
            {"tools": "none"},
            {"chat_template_kwargs": [1]},
            {"messages": [{"role": "robot", "content": "hi"}]},
            {"messages": [{"role": "user", "content": 5}]},
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        ],
    )
    def test_type_errors_are_invalid_field(self, preprocessor, field):
        request = {"model": "chatml", **CHAT_CASES["single_turn"], **field}
        assert run(preprocessor, Route.CHAT, request) == NotMirrored("invalid_field")

    def test_template_exception(self, model_dirs, tmp_path):
        config = json.loads((model_dirs["chatml"] / "tokenizer_config.json").read_text())
        config["chat_template"] = "{{ raise_exception('no system messages') }}"
        for name in ("tokenizer.json", "config.json", "generation_config.json"):
            (tmp_path / name).write_bytes((model_dirs["chatml"] / name).read_bytes())
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
        pre = Preprocessor({"m": load_model("m", str(tmp_path), None)})
        request = {"model": "m", **CHAT_CASES["single_turn"]}
        assert run(pre, Route.CHAT, request) == NotMirrored("template_error")

    def test_reason_outside_the_vocabulary_is_refused(self):
        with pytest.raises(ValueError, match="reason"):
            NotMirrored("client said hello")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
FIELD_NAMES = st.sampled_from(
    [
        "messages", "prompt", "n", "temperature", "top_k", "logprobs", "top_logprobs", "stop",
        "max_tokens", "ignore_eos", "nvext", "tools", "chat_template_kwargs", "response_format",
        "guided_json", "guided_choice", "best_of", "echo", "prompt_embeds", "thinking",
    ]
)  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
    optional={
        "content": st.none()
        | st.text(max_size=30)
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "image_url", "video_url"])},
                optional={"text": st.text(max_size=10), "image_url": JSON_VALUES},
            ),
            max_size=3,
        ),
        "tool_calls": JSON_VALUES,
        "name": st.text(max_size=5),
    },
)


def assert_well_formed(result: object) -> None:
    if isinstance(result, NotMirrored):
        assert result.reason in NOT_MIRRORED_REASONS
        assert result.reason != "internal_error"  # every input has a named reason
    else:
        assert isinstance(result, PreprocessedRequest)
        assert all(isinstance(token, int) for token in result.token_ids)


PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class TestNeverRaises:
    """Whatever the bytes, preprocess returns a request or a reason from the vocabulary."""

    @PROPERTY_SETTINGS
    @given(body=st.binary(max_size=200), route=st.sampled_from(list(Route)))
    def test_random_bytes(self, preprocessor, body, route):
        assert_well_formed(preprocessor.preprocess(route, body, ARRIVAL_NS))

    @PROPERTY_SETTINGS
    @given(
        value=JSON_VALUES,
        fields=st.dictionaries(FIELD_NAMES, JSON_VALUES, max_size=4),
        model=st.sampled_from(MODELS),
        route=st.sampled_from([Route.CHAT, Route.COMPLETIONS]),
    )
    def test_random_json(self, preprocessor, value, fields, model, route):
        assert_well_formed(run(preprocessor, route, value))
        assert_well_formed(run(preprocessor, route, {"model": model, **fields}))

    @PROPERTY_SETTINGS
    @given(messages=st.lists(MESSAGE, max_size=5), model=st.sampled_from(MODELS))
    def test_random_messages(self, preprocessor, messages, model):
        request = {"model": model, "messages": messages}
        assert_well_formed(run(preprocessor, Route.CHAT, request))
