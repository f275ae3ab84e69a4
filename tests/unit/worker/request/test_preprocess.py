"""The preprocessor: every request yields a preprocessed request or a reason, never an exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.fields import NOT_MIRRORED_REASONS, NotMirrored
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model
from tests.support.requests import (
    ARRIVAL_NS,
    CHAT_CASES,
    MODELS,
    run,
)


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
        ("text", "lone"),
        [
            (r"\ud800", True),
            (r"\udc00", True),
            (r"a\ud83d", True),
            (r"\ud83d\u0041", True),
            (r"\ude00\ud83d", True),
            (r"\ud83d\ude00\udc00", True),
            (r"\ud83d\ude00", False),  # a pair: one character
            (r"\uD83D\uDE00", False),
            (r"\\ud800", False),  # a backslash, then text
        ],
    )
    @pytest.mark.parametrize("big", ["", ', "seed": 1e400'])  # msgspec refuses 1e400
    def test_lone_surrogates(self, preprocessor, text, lone, big):
        """A lone surrogate anywhere is refused as the frontend refuses it; a pair is not."""
        message = '{"role": "user", "content": "' + text + '"}'
        body = ('{"model": "chatml", "messages": [' + message + "]" + big + "}").encode()
        result = preprocessor.preprocess(Route.CHAT, body, ARRIVAL_NS)
        if lone:
            assert result == NotMirrored("invalid_json")
        else:
            assert result != NotMirrored("invalid_json")

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
            {"messages": [{"role": 5, "content": "hi"}]},
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


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


FIELD_NAMES = st.sampled_from(
    [
        "messages",
        "prompt",
        "n",
        "temperature",
        "top_k",
        "logprobs",
        "top_logprobs",
        "stop",
        "max_tokens",
        "ignore_eos",
        "nvext",
        "tools",
        "chat_template_kwargs",
        "response_format",
        "guided_json",
        "guided_choice",
        "best_of",
        "echo",
        "prompt_embeds",
        "thinking",
    ]
)


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
