"""The wire format: Dynamo event-plane framing, MessagePack envelopes, heartbeats."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shadow_proxy.records import wire

U64 = st.integers(min_value=0, max_value=2**64 - 1)


def frames(payload: bytes = b"\x81\xa1k\x01", **inner: object) -> list[bytes]:
    """Hand-built frames, so a test can break one part at a time."""
    message = {
        "publisher_id": 7,
        "sequence": 3,
        "published_at": 1_700_000_000_000,
        "topic": "t",
        "payload": payload,
        **inner,
    }
    body = msgpack.packb({k: v for k, v in message.items() if v is not None}, use_bin_type=True)
    return [
        b"t",
        struct.pack(">Q", 7),
        struct.pack(">Q", 3),
        struct.pack(">BI", 1, len(body)) + body,
    ]


class TestFraming:
    """encode_frames lays frames out as Dynamo's ZeroMQ event plane does."""

    def test_layout(self):
        out = wire.encode_frames("shadow-requests-a", 2**53 - 1, 5, 1_700_000_000_123, b"xyz")
        assert len(out) == 4
        assert out[0] == b"shadow-requests-a"
        assert out[1] == struct.pack(">Q", 2**53 - 1)
        assert out[2] == struct.pack(">Q", 5)
        version, length = struct.unpack(">BI", out[3][:5])
        assert (version, length) == (1, len(out[3]) - 5)
        inner = msgpack.unpackb(out[3][5:], raw=False)
        assert list(inner) == ["publisher_id", "sequence", "published_at", "topic", "payload"]
        assert inner["payload"] == b"xyz"
        assert inner["published_at"] == 1_700_000_000_123
        # payload is MessagePack bin (0xc4..), not a str or an array of ints
        assert b"\xc4\x03xyz" in out[3]

    def test_round_trip(self):
        out = wire.encode_frames("t", 1, 0, 2, b"\x00\xff")
        assert wire.decode_frames(out) == wire.Message("t", 1, 0, 2, b"\x00\xff")

    @given(
        topic=st.text(min_size=1, max_size=40),
        publisher_id=U64,
        sequence=U64,
        published_at=U64,
        payload=st.binary(max_size=300),
    )
    def test_round_trip_any(self, topic, publisher_id, sequence, published_at, payload):
        out = wire.encode_frames(topic, publisher_id, sequence, published_at, payload)
        message = wire.decode_frames(out)
        assert message == wire.Message(topic, publisher_id, sequence, published_at, payload)

    def test_out_of_range_values_are_refused(self):
        with pytest.raises(wire.WireError):
            wire.encode_frames("t", 2**64, 0, 0, b"")
        with pytest.raises(wire.WireError):
            wire.encode_frames("t", 0, -1, 0, b"")

    def test_publisher_ids_fit_json(self):
        ids = {wire.new_publisher_id() for _ in range(50)}
        assert all(1 <= i <= 2**53 - 1 for i in ids)
        assert len(ids) > 1


class TestMalformedFrames:
    """Anything off the format raises WireError with a reason from the vocabulary."""

    def test_hand_built_frames_decode(self):
        assert wire.decode_frames(frames()).sequence == 3

    @pytest.mark.parametrize(
        ("mangle", "reason"),
        [
            (lambda f: f[:3], "frames"),
            (lambda f: [*f, b""], "frames"),
            (lambda f: [f[0], f[1][:7], f[2], f[3]], "frames"),
            (lambda f: [f[0], f[1], f[2] + b"\x00", f[3]], "frames"),
            (lambda f: [f[0], f[1], f[2], f[3][:4]], "header"),
            (lambda f: [f[0], f[1], f[2], b"\x02" + f[3][1:]], "header"),
            (lambda f: [f[0], f[1], f[2], f[3] + b"\x00"], "length"),
            (lambda f: [f[0], f[1], f[2], f[3][:-1]], "length"),
            (lambda f: [b"u", *f[1:]], "topic"),
            (lambda f: [b"\xff", *f[1:]], "topic"),
            (lambda f: [f[0], struct.pack(">Q", 8), f[2], f[3]], "message"),
            (lambda f: [f[0], f[1], struct.pack(">Q", 4), f[3]], "message"),
        ],
    )
    def test_mangled(self, mangle, reason):
        with pytest.raises(wire.WireError) as info:
            wire.decode_frames(mangle(frames()))
        assert info.value.reason == reason
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize(
        "body",
        [
            msgpack.packb([7, 3, 0, "t", b""]),  # an array, not a map
            b"\xc1",  # never used byte
            msgpack.packb({"publisher_id": 7, "sequence": 3, "topic": "t", "payload": b""}),
            msgpack.packb({1: 2}),  # non-string key
        ],
    )
    def test_body_not_a_message_map(self, body):
        f = frames()
        f[3] = struct.pack(">BI", 1, len(body)) + body
        with pytest.raises(wire.WireError) as info:
            wire.decode_frames(f)
        assert info.value.reason == "message"

    @pytest.mark.parametrize(
        "inner",
        [
            {"payload": "a str, not bin"},
            {"sequence": -3},
            {"topic": 5},
            {"published_at": "now"},
        ],
    )
    def test_wrong_types(self, inner):
        with pytest.raises(wire.WireError):
            wire.decode_frames(frames(**inner))

    def test_extra_keys_are_tolerated(self):
        """Forward compatible, as serde ignores unknown fields."""
        assert wire.decode_frames(frames(published_at_ns=5)).publisher_id == 7

    @given(st.lists(st.binary(max_size=20), max_size=6))
    def test_garbage_never_escapes_as_another_error(self, garbage):
        try:
            wire.decode_frames(garbage)
        except wire.WireError:
            pass


class TestEnvelopeCodec:
    """Envelopes are MessagePack maps with string keys, bytes as bin."""

    def test_round_trip(self):
        envelope = {"seq": 1, "filters": ["a"], "request": {"token_ids": [1, 2]}, "b": b"\x00"}
        data = wire.encode_envelope(envelope)
        assert data[0] & 0xF0 == 0x80  # fixmap
        assert wire.decode_envelope(data) == envelope

    @pytest.mark.parametrize(
        "data", [msgpack.packb([1, 2]), b"", b"\xc1", msgpack.packb({1: "x"}), b"\x81"]
    )
    def test_not_a_map(self, data):
        with pytest.raises(wire.WireError) as info:
            wire.decode_envelope(data)
        assert info.value.reason == "envelope"

    def test_unencodable(self):
        with pytest.raises(wire.WireError) as info:
            wire.encode_envelope({"x": object()})
        assert info.value.reason == "encode"
        with pytest.raises(wire.WireError):
            wire.encode_envelope([1, 2])  # type: ignore[arg-type]


class TestHeartbeat:
    """Heartbeats ride on '{topic}.heartbeat' and carry the tap's counters."""

    def test_topic(self):
        assert wire.heartbeat_topic("shadow-requests-a") == "shadow-requests-a.heartbeat"

    def test_round_trip(self):
        beat = wire.Heartbeat("a", 9, 10, 7, queued=11, published=8, dropped={"full": 1})
        assert wire.Heartbeat.decode(beat.encode()) == beat

    def test_nil_before_the_first_record(self):
        beat = wire.Heartbeat("a", 9, 0, None)
        raw = msgpack.unpackb(beat.encode(), raw=False)
        assert raw["last_transport_sequence"] is None
        assert wire.Heartbeat.decode(beat.encode()).last_transport_sequence is None

    @pytest.mark.parametrize(
        "change",
        [{"next_seq": -1}, {"tap": 3}, {"dropped": {"full": "x"}}, {"queued": 1.5}],
    )
    def test_malformed(self, change):
        raw = msgpack.unpackb(wire.Heartbeat("a", 9, 1, 0).encode(), raw=False)
        raw.update(change)
        with pytest.raises(wire.WireError) as info:
            wire.Heartbeat.decode(msgpack.packb(raw))
        assert info.value.reason == "heartbeat"
