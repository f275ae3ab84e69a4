"""The preprocessed request: Dynamo's field names, in one list the projection decides."""

from __future__ import annotations

import attrs
import pytest

from shadow_proxy.records.preprocessed import FIELD_NAMES, PreprocessedRequest

#: Dynamo's ``PreprocessedRequest`` fields (SPEC section 3), in its order.
DYNAMO_FIELDS = (
    "model",
    "token_ids",
    "stop_conditions",
    "sampling_options",
    "output_options",
    "eos_token_ids",
    "annotations",
    "routing",
    "extra_args",
    "multi_modal_data",
    "agent_context",
    "image_cache_scope",
    "mdc_sum",
    "request_timestamp_ms",
)
#: Fields this sidecar adds after Dynamo's (a reader of Dynamo's records ignores them).
EXTENSIONS = ("prompt_spans",)


def request(**overrides) -> PreprocessedRequest:
    return PreprocessedRequest(
        **{
            "model": "m",
            "token_ids": [1],
            "stop_conditions": {},
            "sampling_options": {},
            "output_options": {},
            "eos_token_ids": [2],
            **overrides,
        }
    )


def test_field_names_are_dynamos() -> None:
    assert FIELD_NAMES == DYNAMO_FIELDS + EXTENSIONS


def test_optional_fields_default_to_empty() -> None:
    pre = request()
    assert (pre.annotations, pre.routing, pre.extra_args, pre.multi_modal_data) == ([], {}, {}, {})
    assert (pre.agent_context, pre.mdc_sum, pre.request_timestamp_ms) == ({}, None, None)


def test_defaults_are_not_shared() -> None:
    a, b = request(), request()
    a.routing["pin"] = 1
    assert b.routing == {}


def test_has_multimodal() -> None:
    assert not request().has_multimodal
    assert request(multi_modal_data={"image_url": [{"url": "x"}]}).has_multimodal


def test_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        request().model = "other"  # type: ignore[misc]
