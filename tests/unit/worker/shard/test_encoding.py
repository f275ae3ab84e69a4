"""A record's bytes with what can be recorded kept: lone surrogates and integers
MessagePack cannot hold are repaired and said; anything else is refused."""

from __future__ import annotations

import msgpack
import pytest

from shadow_proxy.records.wire import WireError, decode_envelope
from shadow_proxy.worker.shard.encoding import MAX_DEPTH, encode_record


def nested(depth: int, leaf: object) -> dict:
    value: object = leaf
    for _ in range(depth):
        value = {"k": value}
    return value  # type: ignore[return-value]


class TestRepaired:
    """What a client sent that MessagePack refuses is replaced and named in ``sanitized``."""

    def test_lone_surrogates_replaced_and_said(self) -> None:
        payload = encode_record({"request": {"stop": ["a\ud800b"]}, "seq": 0})
        envelope = decode_envelope(payload)
        assert envelope["request"]["stop"] == ["a\ufffdb"]
        assert envelope["sanitized"] == ["lone_surrogates"]

    def test_surrogate_in_a_key(self) -> None:
        envelope = msgpack.unpackb(encode_record({"request": {"x\udfff": 1}}))
        assert envelope["request"] == {"x\ufffd": 1}

    def test_big_integers_as_strings_and_said(self) -> None:
        payload = encode_record({"request": {"extra_args": {"ids": [1, 2**64, -(2**63) - 1]}}})
        envelope = msgpack.unpackb(payload)
        assert envelope["request"]["extra_args"]["ids"] == [1, str(2**64), str(-(2**63) - 1)]
        assert envelope["sanitized"] == ["big_integers"]

    def test_both_causes_sorted(self) -> None:
        envelope = msgpack.unpackb(encode_record({"a": "\ud800", "b": (2**70,)}))
        assert envelope["sanitized"] == ["big_integers", "lone_surrogates"]
        assert envelope["b"] == [str(2**70)]

    def test_edges_of_the_integer_range_untouched(self) -> None:
        clean = {"a": "ü", "lo": -(2**63), "hi": 2**64 - 1, "f": 1.5, "n": None}
        payload = encode_record(clean)
        assert msgpack.unpackb(payload) == clean


class TestRefused:
    """A record that cannot be repaired is refused with ``WireError``, bounded in depth."""

    def test_nothing_to_repair(self) -> None:
        with pytest.raises(WireError, match="cannot encode envelope"):
            encode_record({"a": object()})

    def test_depth_is_bounded(self) -> None:
        with pytest.raises(WireError, match=f"deeper than {MAX_DEPTH}"):
            encode_record(nested(MAX_DEPTH + 5, 2**70))

    def test_deep_but_within_the_bound_is_repaired(self) -> None:
        envelope = msgpack.unpackb(encode_record(nested(MAX_DEPTH - 1, 2**70)))
        assert envelope["sanitized"] == ["big_integers"]
