"""Typed reading of an OpenAI request's JSON fields, for the preprocessor.

Pure. A field of the wrong type or out of range stops preprocessing with
``Reject("invalid_field")`` (the frontend rejects such a request too); every
reason comes from ``NOT_MIRRORED_REASONS`` and never carries client text.
"""

from __future__ import annotations

from typing import Any

import attrs

NOT_MIRRORED_REASONS: tuple[str, ...] = (
    "content_encoding",  # a Content-Encoding the worker does not decode, or bytes that fail to
    "body_too_large",  # the decoded body exceeds upstream.max_request_bytes
    "too_large",  # the serving loop answered 413 (counted there: the worker never sees it)
    "body_timeout",  # the serving loop answered 408 (counted there)
    "non_utf8",  # the body is not UTF-8
    "invalid_json",  # the body is not JSON (NaN and Infinity included, as serde rejects them)
    "not_an_object",  # the JSON is not an object
    "missing_model",  # no string `model`
    "unknown_model",  # a model not in the configuration
    "missing_messages",  # chat without a non-empty `messages` list, responses without `input`
    "missing_prompt",  # completions without `prompt` (or `prompt_embeds`)
    "invalid_field",  # a field of the wrong type or shape; the frontend rejects it too
    "batch_prompt",  # a guard: batches are split into one request per prompt before this
    "prompt_over_budget",  # prompt text over worker.max_prompt_bytes: not rendered or encoded
    "template_error",  # the chat template failed (raise_exception included) or is missing
    "tokenizer_error",  # the tokenizer failed
    "previous_response",  # responses: `previous_response_id`, a prompt the frontend keeps
    "stored_prompt",  # responses: `prompt` (a stored prompt template), kept by the frontend
    "unsupported_route",  # not a chat, completions or responses request
    "internal_error",  # a bug here; logged with the exception type only
)

U32 = 2**32
I32 = 2**31
I64 = 2**63


@attrs.frozen
class NotMirrored:
    """A request that yields no record, and why (a value of ``NOT_MIRRORED_REASONS``)."""

    reason: str = attrs.field(validator=attrs.validators.in_(NOT_MIRRORED_REASONS))


class Reject(Exception):
    """Internal: stop preprocessing with a reason from the vocabulary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def reject_constant(_name: str) -> None:
    """``json.loads``' ``parse_constant``: NaN and Infinity are not JSON (serde agrees)."""
    raise Reject("invalid_json")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(obj: dict, key: str, low: int, high: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not is_int(value) or not low <= value < high:
        raise Reject("invalid_field")
    return value


def number(obj: dict, key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Reject("invalid_field")
    return float(value)


def boolean(obj: dict, key: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise Reject("invalid_field")
    return value


def mapping(obj: dict, key: str) -> dict | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, dict):
        raise Reject("invalid_field")
    return value


def string(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise Reject("invalid_field")
    return value


def strings(obj: dict, key: str) -> list[str] | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise Reject("invalid_field")
    return list(value)


def compact(values: dict[str, Any]) -> dict[str, Any]:
    """The dict without its unset (None) entries."""
    return {key: value for key, value in values.items() if value is not None}
