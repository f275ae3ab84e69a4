"""The hand-off frames: every layout packs and unpacks to what was given."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shadow_proxy.channel import frames as hf
from shadow_proxy.exchange import EndKind, Route


class TestHeader:
    """The first frame: one-byte kind, 8-byte key, then the kind's meta."""

    def test_request_header_round_trip(self) -> None:
        key = hf.KEY.pack(41)
        meta = hf.REQUEST_META.pack(Route.CHAT, 1_700_000_000_000_000_000, 123, 7)
        kind, got_key, got_meta = hf.split_header(hf.KIND_REQUEST + key + meta)
        assert (kind, got_key) == (hf.KIND_REQUEST, key)
        assert hf.KEY.unpack(got_key) == (41,)
        assert hf.REQUEST_META.unpack(got_meta) == (Route.CHAT, 1_700_000_000_000_000_000, 123, 7)

    def test_end_header_round_trip(self) -> None:
        frame = hf.KIND_END + hf.KEY.pack(2) + hf.END_META.pack(EndKind.CLIENT_GONE, 999)
        kind, key, meta = hf.split_header(frame)
        assert kind == hf.KIND_END and hf.KEY.unpack(key) == (2,)
        assert EndKind(hf.END_META.unpack(meta)[0]) is EndKind.CLIENT_GONE
        assert hf.END_META.unpack(meta)[1] == 999

    def test_layout_sizes(self) -> None:
        assert hf.HEADER == 9
        assert (hf.REQUEST_META.size, hf.HEAD_META.size, hf.END_META.size) == (25, 18, 9)
        kinds = {hf.KIND_REQUEST, hf.KIND_CHUNK, hf.KIND_END, hf.KIND_LAST}
        assert len(kinds) == 4 and all(len(k) == 1 for k in kinds)

    def test_last_message_is_kind_z_with_key_0(self) -> None:
        kind, key, meta = hf.split_header(hf.LAST_MESSAGE)
        assert (kind, hf.KEY.unpack(key), meta) == (hf.KIND_LAST, (0,), b"")


class TestHead:
    """The response head: status, offset, content type and encoding, and when the
    request was sent upstream."""

    def test_round_trip(self) -> None:
        frame = hf.pack_head(200, 12_345, "text/event-stream; charset=utf-8", "gzip", 678)
        assert hf.unpack_head(frame) == (
            200, 12_345, "text/event-stream; charset=utf-8", "gzip", 678
        )  # fmt: skip

    def test_empty_values(self) -> None:
        assert hf.unpack_head(hf.pack_head(502, 0, "", "")) == (502, 0, "", "", 0)

    def test_no_head(self) -> None:
        assert hf.unpack_head(b"") is None

    def test_non_latin1_header_text_is_replaced_not_raised(self) -> None:
        _, _, content_type, _, _ = hf.unpack_head(hf.pack_head(200, 1, "text/plain; x=日本", ""))
        assert content_type == "text/plain; x=??"


class TestChunks:
    """An index of offsets and lengths, and the chunks joined: any chunks come back."""

    def test_round_trip(self) -> None:
        chunks = [b"data: a\n\n", b"", b"data: bc\n\n"]
        index, data = hf.pack_chunks([10, 20, 30], chunks)
        assert len(index) == 3 * 12
        assert data == b"".join(chunks)
        assert hf.unpack_chunks(index, data) == [(chunks[0], 10), (b"", 20), (chunks[2], 30)]

    def test_none(self) -> None:
        index, data = hf.pack_chunks([], [])
        assert (index, data) == (b"", b"")
        assert hf.unpack_chunks(index, data) == []

    @given(
        st.lists(
            st.tuples(st.binary(max_size=64), st.integers(min_value=0, max_value=2**64 - 1)),
            max_size=40,
        )
    )
    def test_any_chunks(self, pairs: list[tuple[bytes, int]]) -> None:
        index, data = hf.pack_chunks([o for _, o in pairs], [c for c, _ in pairs])
        assert hf.unpack_chunks(index, data) == pairs

    def test_offset_out_of_range_is_refused(self) -> None:
        with pytest.raises(struct.error):
            hf.pack_chunks([2**64], [b"x"])


class TestFrameAt:
    """One frame of a stream message, read by skipping the ones before."""

    def test_each_frame_and_past_the_end(self):
        frames = [b"q" + b"k" * 8, b"rid", b"body" * 1000, b"x-session-id:s\n", b""]
        message = b"".join(hf.stream_buffers(frames)[0])
        assert [hf.frame_at(message, i) for i in range(5)] == frames
        assert hf.frame_at(message, 5) is None
        assert hf.frame_at(message[:-4], 4) is None  # cut short
