"""Typed reading of an OpenAI request's JSON fields, for the preprocessor.

Pure. A field of the wrong type or out of range stops preprocessing with
``Reject("invalid_field")`` (the frontend rejects such a request too); every
reason comes from ``NOT_MIRRORED_REASONS`` and never carries client text.
"""

from __future__ import annotations

from typing import Any

import attrs

from shadow_proxy.exchange import NotMirrored as NotMirroredReason

#: Why a request yields no record (the vocabulary both processes count).
NOT_MIRRORED_REASONS = tuple(NotMirroredReason)

U32 = 2**32
I32 = 2**31
I64 = 2**63


def _reason(value: str) -> NotMirroredReason:
    try:
        return NotMirroredReason(value)
    except ValueError:
        msg = f"'reason' must be one of NOT_MIRRORED_REASONS (got {value!r})"
        raise ValueError(msg) from None


@attrs.frozen
class NotMirrored:
    """A request that yields no record, and why (a value of ``NOT_MIRRORED_REASONS``)."""

    reason: NotMirroredReason = attrs.field(converter=_reason)


class Reject(Exception):
    """Internal: stop preprocessing with a reason from the vocabulary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = _reason(reason)


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
