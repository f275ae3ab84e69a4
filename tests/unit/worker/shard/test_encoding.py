"""A record's bytes with what can be recorded kept: lone surrogates and integers
MessagePack cannot hold are repaired and said; anything else is refused."""

from __future__ import annotations

import msgpack
import pytest

from shadow_proxy.records.wire import WireError, decode_envelope, encode_envelope
from shadow_proxy.worker.shard import encoding
from shadow_proxy.worker.shard.encoding import MAX_DEPTH


def encode_record(envelope: dict, seq: int = 0) -> bytes:
    """The record's bytes once its seq is written in (an envelope without a
    ``seq`` gets one, last)."""
    return encoding.encode_record({**envelope, "seq": None}).with_seq(seq)


def without_seq(envelope: dict) -> dict:
    return {k: v for k, v in envelope.items() if k != "seq"}


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
        assert without_seq(msgpack.unpackb(payload)) == clean


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


class TestSeqLeftToTheSink:
    """The two pieces around the seq's value, joined with any seq, are the bytes of
    one ``packb`` of the envelope with that seq: a consumer cannot tell."""

    @pytest.mark.parametrize("seq", [0, 1, 127, 128, 2**16, 2**40 + 3, 2**64 - 1])
    def test_byte_for_byte(self, seq: int) -> None:
        envelope = {
            "schema_version": 1,
            "tap": "kv-history_1",
            "seq": None,
            "request_id": "seq \xa3seq",
            "request": {"token_ids": [2**64 - 1, 5], "seq": 7, "blob": b"\x00\xff"},
        }
        record = encoding.encode_record(envelope)
        assert record.with_seq(seq) == encode_envelope({**envelope, "seq": seq})

    def test_sanitized_too(self) -> None:
        record = encoding.encode_record({"seq": None, "a": "\ud800"})
        assert decode_envelope(record.with_seq(9)) == {
            "seq": 9,
            "a": "\ufffd",
            "sanitized": ["lone_surrogates"],
        }

    def test_an_envelope_has_a_seq(self) -> None:
        with pytest.raises(WireError, match="seq"):
            encoding.encode_record({"tap": "kv"})


class TestPackedOnce:
    """A request's long lists are packed once for all its records, the bytes unchanged."""

    def test_same_bytes_and_packed_once(self) -> None:
        ids = list(range(1_000))
        kv = {"schema_version": 1, "tap": "kv", "seq": None, "request": {"token_ids": ids}}
        replay = {
            **kv,
            "tap": "replay",
            "request": {"model": "m", "token_ids": ids, "stop": list(range(300))},
            "response": {"choices": [{"token_ids": list(range(400))}]},
        }
        packed: encoding.Packed = {}
        first = encoding.encode_record(kv, packed).with_seq(3)
        assert list(packed) == [id(ids)]
        ids_bytes = packed[id(ids)][1]
        second = encoding.encode_record(replay, packed).with_seq(4)
        assert packed[id(ids)][1] is ids_bytes, "the shared ids were packed again"
        assert len(packed) == 2  # the stop list too; the response's lists are not kept
        assert first == encoding.encode_record(kv).with_seq(3) == encode_envelope({**kv, "seq": 3})
        assert second == encode_envelope({**replay, "seq": 4})

    def test_another_list_of_the_same_id_is_packed_anew(self) -> None:
        packed: encoding.Packed = {}
        encoding.encode_record({"seq": None, "request": {"token_ids": list(range(300))}}, packed)
        other = {"seq": None, "request": {"token_ids": list(range(5, 305))}}
        stale = next(iter(packed))
        packed[id(other["request"]["token_ids"])] = packed.pop(stale)  # as if an id were reused
        assert encoding.encode_record(other, packed).with_seq(0) == encode_envelope(
            {**other, "seq": 0}
        )

    def test_ids_packed_when_encoded(self) -> None:
        """A prompt's ids as the encoder gives them (``TokenIds``, their MessagePack
        made with them) go into the record as they are: the same bytes."""
        from shadow_proxy.worker.request.incremental import TokenIds

        plain = [5, 300, 70_000, 127, 128, 255, 256, 65_535, 65_536] * 40
        ids = TokenIds(plain)
        ids.items = msgpack.packb(plain)[3:]
        envelope = {"seq": None, "request": {"token_ids": ids}}
        assert encoding.encode_record(envelope, {}).with_seq(1) == encode_envelope(
            {"seq": 1, "request": {"token_ids": plain}}
        )
        ids.items = b""  # the packer's are what the record takes
        assert encoding.encode_record(envelope, {}).with_seq(1) != encode_envelope(
            {"seq": 1, "request": {"token_ids": plain}}
        )
