"""The hand-off messages: each encodes to frames and decodes back to itself; the
main reads what it routes by without decoding the body."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shadow_proxy.channel import checkpoint as cp
from shadow_proxy.channel import handoff
from shadow_proxy.channel.handoff import (
    KEY,
    Chunks,
    End,
    HandoffError,
    Head,
    Hello,
    Kind,
    Last,
    Pieces,
    Request,
)
from shadow_proxy.channel.stream import split_frames, stream_message
from shadow_proxy.exchange import EndKind, Route

KEY_41 = KEY.pack(41)


def request(**changes) -> Request:
    fields = dict(
        key=KEY_41,
        route=Route.CHAT,
        arrival_unix_ns=1_700_000_000_000_000_000,
        arrival_mono_ns=123,
        lost_before=7,
        request_id="rid-1",
        body=b'{"model":"m"}' * 100,
        engine_headers=b"x-session-id:s\n",
        content_encoding="gzip",
    )
    return Request(**{**fields, **changes})


def round_trip(message: handoff.HandoffMessage) -> handoff.HandoffMessage:
    return handoff.decode(split_frames(stream_message(message.encode())))


class TestRoundTrip:
    """What one side encodes, the other decodes to the same message."""

    def test_hello(self) -> None:
        dead = cp.TapState(name="kv", publisher_id=9, next_seq=5, dropped={"worker_died": 2})
        assert round_trip(Hello(3, 4, (dead,))) == Hello(3, 4, (dead,))
        assert round_trip(Hello(1, 0)) == Hello(1, 0)

    def test_request(self) -> None:
        assert round_trip(request()) == request()
        assert round_trip(request(engine_headers=b"", content_encoding="")) == request(
            engine_headers=b"", content_encoding=""
        )

    def test_chunks_and_end(self) -> None:
        head = Head(200, 12_345, "text/event-stream; charset=utf-8", "gzip", 678)
        chunks = Chunks(
            KEY_41, head, [10, 20, 30], Pieces.of([b"data: a\n\n", b"", b"data: bc\n\n"])
        )
        assert round_trip(chunks) == chunks
        end = End(KEY_41, EndKind.CLIENT_GONE, 999, None, "client gone", [40], Pieces.of([b"x"]))
        assert round_trip(end) == end
        assert round_trip(End.lost(KEY_41, 5)) == End(KEY_41, EndKind.CAPTURE_LOST, 5)

    def test_last(self) -> None:
        assert round_trip(Last()) == Last()
        assert Last().encode() == [b"z" + KEY.pack(0)]

    @given(
        st.lists(
            st.tuples(st.binary(max_size=64), st.integers(min_value=0, max_value=2**64 - 1)),
            max_size=40,
        )
    )
    def test_any_chunks(self, pairs: list[tuple[bytes, int]]) -> None:
        chunks = Chunks(KEY_41, None, [o for _, o in pairs], Pieces.of([c for c, _ in pairs]))
        assert round_trip(chunks) == chunks

    def test_offset_out_of_range_is_refused(self) -> None:
        with pytest.raises(struct.error):
            Chunks(KEY_41, None, [2**64], Pieces.of([b"x"])).encode()


class TestHead:
    """The response head: status, offset, content type and encoding, and when the
    request was sent upstream."""

    def test_sent_offset_round_trips(self) -> None:
        head = Head(200, 12_345, "text/event-stream", "", sent_offset_ns=678)
        decoded = Head.decode(head.encode())
        assert decoded is not None and decoded.sent_offset_ns == 678

    def test_empty_values_and_none(self) -> None:
        assert Head.decode(Head(502, 0, "", "").encode()) == Head(502, 0, "", "")
        assert Head.decode(b"") is None

    def test_non_latin1_header_text_is_replaced_not_raised(self) -> None:
        head = Head.decode(Head(200, 1, "text/plain; x=日本", "").encode())
        assert head is not None and head.content_type == "text/plain; x=??"


class TestRouting:
    """The main routes a stream message by its kind, key, arrival, losses and
    engine headers, read in place."""

    def test_peek_and_routing(self) -> None:
        data = stream_message(request().encode())
        assert handoff.peek(data) == (Kind.REQUEST.value, KEY_41)
        assert Request.routing(data) == (123, 7, b"x-session-id:s\n")

    def test_a_request_without_headers_frame(self) -> None:
        frames = request().encode()[:3]
        assert Request.routing(stream_message(frames))[2] is None


class TestMalformed:
    """Frames that are not a message are refused with ``HandoffError``."""

    def test_unknown_kind_and_short_meta(self) -> None:
        with pytest.raises(HandoffError):
            handoff.decode([b"?" + KEY_41])
        with pytest.raises(HandoffError):
            handoff.decode([b"q" + KEY_41 + b"short-meta", b"secret"])
        with pytest.raises(HandoffError):
            handoff.decode([])
