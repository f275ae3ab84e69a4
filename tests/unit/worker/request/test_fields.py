"""Typed reading of a request's JSON fields; reasons from a fixed vocabulary."""

from __future__ import annotations

import pytest

from shadow_proxy.worker.request import fields
from shadow_proxy.worker.request.fields import NOT_MIRRORED_REASONS, NotMirrored


class TestNotMirroredReasons:
    """A reason outside the vocabulary cannot be built."""

    def test_reason_outside_the_vocabulary_is_refused(self):
        with pytest.raises(ValueError, match="reason"):
            NotMirrored("client said hello")


class TestTypedFields:
    """A field of the wrong type or out of range is ``invalid_field``; unset is None."""

    def rejects(self, read, *args) -> None:
        with pytest.raises(fields.Reject) as caught:
            read(*args)
        assert caught.value.reason == "invalid_field"

    def test_integer(self) -> None:
        assert fields.integer({"n": 3}, "n", 1, 10) == 3
        assert fields.integer({}, "n", 1, 10) is None
        for bad in (0, 10, True, 2.0, "3"):
            self.rejects(fields.integer, {"n": bad}, "n", 1, 10)

    def test_number(self) -> None:
        assert fields.number({"t": 1}, "t") == 1.0 and type(fields.number({"t": 1}, "t")) is float
        assert fields.number({"t": None}, "t") is None
        for bad in (True, "0.5", [1]):
            self.rejects(fields.number, {"t": bad}, "t")

    def test_boolean_mapping_string_strings(self) -> None:
        assert fields.boolean({"b": False}, "b") is False
        self.rejects(fields.boolean, {"b": 0}, "b")
        assert fields.mapping({"m": {}}, "m") == {}
        self.rejects(fields.mapping, {"m": []}, "m")
        assert fields.string(None) is None and fields.string("x") == "x"
        self.rejects(fields.string, 5)
        assert fields.strings({"s": ["a", "b"]}, "s") == ["a", "b"]
        self.rejects(fields.strings, {"s": "a"}, "s")
        self.rejects(fields.strings, {"s": ["a", 1]}, "s")

    def test_is_int_and_compact(self) -> None:
        assert fields.is_int(3) and not fields.is_int(True) and not fields.is_int(3.0)
        assert fields.compact({"a": 0, "b": None, "c": ""}) == {"a": 0, "c": ""}

    def test_nan_and_infinity_are_not_json(self) -> None:
        with pytest.raises(fields.Reject, match="invalid_json"):
            fields.reject_constant("NaN")

    def test_every_reason_is_a_not_mirrored_value(self) -> None:
        assert len(set(NOT_MIRRORED_REASONS)) == len(NOT_MIRRORED_REASONS)
        assert all(NotMirrored(r).reason == r for r in NOT_MIRRORED_REASONS)
