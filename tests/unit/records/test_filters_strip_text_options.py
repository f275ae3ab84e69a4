"""``strip-text-options`` (issue 18 item 9): the stop strings and guided-decoding
schemas that even ``tokens-only`` keeps leave no record; nothing else changes."""

from __future__ import annotations

from shadow_proxy.records.filters import FilterSet
from shadow_proxy.records.preprocessed import PreprocessedRequest

SECRET = "sk-SECRET-in-a-stop-string"


def request() -> PreprocessedRequest:
    return PreprocessedRequest(
        model="m",
        token_ids=[1, 2, 3],
        stop_conditions={"max_tokens": 16, "stop": [SECRET, "\n\n"], "stop_token_ids_hidden": [2]},
        sampling_options={
            "temperature": 0.5,
            "guided_decoding": {"json": {"properties": {SECRET: {"type": "string"}}}},
        },
        output_options={"logprobs": 1},
        eos_token_ids=[2],
    )


def test_drops_stop_strings_and_schemas_only():
    plain = FilterSet.parse(["tokens-only"]).project(request())
    stripped = FilterSet.parse(["tokens-only", "strip-text-options"]).project(request())
    assert SECRET in repr(plain)  # tokens-only alone keeps them
    assert SECRET not in repr(stripped)
    assert stripped["stop_conditions"] == {"max_tokens": 16, "stop_token_ids_hidden": [2]}
    assert stripped["sampling_options"] == {"temperature": 0.5}
    rest = {k: v for k, v in plain.items() if k not in ("stop_conditions", "sampling_options")}
    assert {k: v for k, v in stripped.items() if k in rest} == rest


def test_a_projection_of_its_own_and_named_in_the_record():
    with_text = FilterSet.parse([])
    without = FilterSet.parse(["strip-text-options"])
    assert with_text.projection_key != without.projection_key
    assert "strip-text-options" in without.names
