"""The incremental SSE parser: WHATWG line and field rules, any chunking, bounds."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shadow_proxy.worker.response.sse import LINE_OVERHEAD, MAX_COMMENTS, SSEEvent, SSEParser


def parse(*chunks: bytes, max_event_bytes: int = 1 << 20) -> tuple[list[SSEEvent], SSEParser]:
    parser = SSEParser(max_event_bytes)
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    parser.close()
    return events, parser


STREAM = (
    "\ufeff: opening comment\n"
    'data: {"text": "héllo wörld ✓ 🙂"}\n'
    "\n"
    "event: update\n"
    "id: 42\n"
    "data: line one\n"
    "data:line two\n"
    "data\n"
    "\n"
    ": keep-alive\n"
    "\n"
    "event: error\n"
    ": worker died\n"
    "\n"
    "data: [DONE]\n"
    "\n"
).encode()

EXPECTED = [
    SSEEvent('{"text": "héllo wörld ✓ 🙂"}', "message", "", ("opening comment",)),
    SSEEvent("line one\nline two\n", "update", "42", ()),
    SSEEvent("", "error", "42", ("worker died",)),
    SSEEvent("[DONE]", "message", "42", ()),
]


class TestFields:
    """Fields, comments, data joining, ids and the BOM follow the WHATWG rules."""

    def test_reference_stream(self) -> None:
        events, parser = parse(STREAM)
        assert events == EXPECTED
        assert parser.events == 4
        assert parser.truncated_events == 0

    def test_space_after_colon_is_optional_and_only_one_is_removed(self) -> None:
        events, _ = parse(b"data:a\ndata: b\ndata:  c\n\n")
        assert events == [SSEEvent("a\nb\n c")]

    def test_empty_data_line_dispatches_empty_event(self) -> None:
        events, _ = parse(b"data:\n\n")
        assert events == [SSEEvent("")]

    def test_comment_only_block_is_not_dispatched(self) -> None:
        events, _ = parse(b": ping\n\n: ping\n\n")
        assert events == []

    def test_event_without_data_is_dispatched(self) -> None:
        """Deliberate difference from browsers: Dynamo's error events have no data."""
        events, _ = parse(b"event: error\n: boom -- worker 3\n\n")
        assert events == [SSEEvent("", "error", "", ("boom -- worker 3",))]

    def test_id_persists_and_nul_id_is_ignored(self) -> None:
        events, _ = parse(b"id: 1\ndata: a\n\ndata: b\n\nid: x\0y\ndata: c\n\nid\ndata: d\n\n")
        assert [e.id for e in events] == ["1", "1", "1", ""]

    def test_unknown_fields_ignored_and_retry_read(self) -> None:
        events, parser = parse(b"foo: bar\nretry: 1500\nretry: soon\ndata: x\n\n")
        assert events == [SSEEvent("x")]
        assert parser.retry_ms == 1500

    def test_bom_only_skipped_once(self) -> None:
        events, _ = parse(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\ndata: y\n\n")
        # The second BOM makes the first line a field named "\ufeffdata": ignored.
        assert events == [SSEEvent("y")]

    def test_invalid_utf8_is_replaced(self) -> None:
        events, _ = parse(b"data: a\xffb\n\n")
        assert events == [SSEEvent("a\ufffdb")]

    def test_unfinished_event_is_discarded_at_close(self) -> None:
        events, parser = parse(b"data: a\n\ndata: b\n")
        assert events == [SSEEvent("a")]
        assert parser.truncated_events == 1

    def test_rejects_non_positive_cap(self) -> None:
        with pytest.raises(ValueError, match="max_event_bytes"):
            SSEParser(0)


class TestLineEnds:
    """LF, CRLF and CR end lines alike, also split between CR and LF."""

    @pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
    def test_each_line_end(self, eol: bytes) -> None:
        events, _ = parse(STREAM.replace(b"\n", eol))
        assert events == EXPECTED

    def test_mixed_line_ends(self) -> None:
        events, _ = parse(b"data: a\r\ndata: b\rdata: c\n\r\n")
        assert events == [SSEEvent("a\nb\nc")]

    def test_crlf_split_across_chunks_is_one_line_end(self) -> None:
        events, _ = parse(b"data: a\r", b"\n", b"data: b\r", b"\n\r", b"\n")
        assert events == [SSEEvent("a\nb")]

    def test_cr_then_blank_line_in_next_chunk(self) -> None:
        events, _ = parse(b"data: a\r", b"\r")
        assert events == [SSEEvent("a")]


class TestChunking:
    """Any split of the byte stream yields the same events."""

    def test_every_two_way_split(self) -> None:
        for i in range(len(STREAM) + 1):
            events, _ = parse(STREAM[:i], STREAM[i:])
            assert events == EXPECTED, i

    def test_byte_by_byte(self) -> None:
        events, _ = parse(*(STREAM[i : i + 1] for i in range(len(STREAM))))
        assert events == EXPECTED

    @settings(max_examples=150, deadline=None)
    @given(
        eol=st.sampled_from(["\n", "\r\n", "\r"]),
        cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    )
    def test_any_split(self, eol: str, cuts: list[int]) -> None:
        stream = STREAM.replace(b"\n", eol.encode())
        bounds = sorted({min(c, len(stream)) for c in cuts})
        pieces = [stream[a:b] for a, b in zip([0, *bounds], [*bounds, len(stream)], strict=True)]
        events, _ = parse(*pieces)
        assert events == EXPECTED


class TestBounds:
    """An event over the cap is dropped and counted; the buffer never exceeds the cap."""

    def test_oversized_event_in_one_chunk(self) -> None:
        big = b"data: " + b"x" * 200 + b"\n"
        events, parser = parse(
            b"data: a\n\n" + big * 3 + b"\n" + b"data: b\n\n", max_event_bytes=500
        )
        assert events == [SSEEvent("a"), SSEEvent("b")]
        assert parser.oversized_events == 1

    def test_oversized_line_arriving_in_small_chunks(self) -> None:
        parser = SSEParser(1000)
        events = parser.feed(b"data: a\n\ndata: ")
        for _ in range(500):
            events += parser.feed(b"y" * 64)
            assert parser._tail_len <= 1000
            assert sum(len(p) for p in parser._tail) <= 1000
        events += parser.feed(b"\r")
        events += parser.feed(b"\ndata: more of the big event\n\ndata: b\n\n")
        assert events == [SSEEvent("a"), SSEEvent("b")]
        assert parser.oversized_events == 1

    def test_skipped_line_end_is_not_a_blank_line(self) -> None:
        """The terminator of a dropped line must not end the event early."""
        parser = SSEParser(100)
        events = parser.feed(b"data: " + b"z" * 200)
        events += parser.feed(b"\n")
        events += parser.feed(b"data: tail of the big event\n")
        events += parser.feed(b"\ndata: ok\n\n")
        assert events == [SSEEvent("ok")]
        assert parser.oversized_events == 1

    def test_event_just_under_the_cap_is_kept(self) -> None:
        line = b"data: " + b"q" * 94  # 100 bytes
        events, parser = parse(line + b"\n\n", max_event_bytes=100 + LINE_OVERHEAD)
        assert events == [SSEEvent("q" * 94)]
        assert parser.oversized_events == 0
        events, parser = parse(line + b"q\n\n", max_event_bytes=100 + LINE_OVERHEAD)
        assert events == []
        assert parser.oversized_events == 1

    def test_many_short_lines_count_their_overhead(self) -> None:
        """1000 lines of 7 bytes fit 8 KiB as bytes, not as Python objects."""
        events, parser = parse(b"data: a\n" * 1000 + b"\n", max_event_bytes=8192)
        assert events == []
        assert parser.oversized_events == 1

    def test_comments_kept_per_event_are_capped(self) -> None:
        events, _ = parse(b": c\n" * 100 + b"event: error\n\n", max_event_bytes=1000)
        assert events == [SSEEvent("", "error", "", ("c",) * MAX_COMMENTS)]


LINES = [
    b"data: {}",
    b"data:x",
    b"data:",
    b"data: " + b"y" * 40,
    b"event: error",
    b": keep-alive",
    b"id: 7",
    b"",
    b"data: a\r",
    b"\xef\xbb\xbfdata: bom",
]


class TestWholeData:
    """``whole_data`` takes a chunk only when it is whole one-line data events, and
    then gives what ``feed`` would: the same values, the same count."""

    @settings(max_examples=300, deadline=None)
    @example(before=[], chunk=[b"data: a\r"], end=b"\n\n", cap=1 << 20)  # \r\n is one end
    @example(before=[b"data: x"], chunk=[b"data: a"], end=b"\n\n", cap=1 << 20)  # joined
    @example(before=[], chunk=[b"data: " + b"y" * 40], end=b"\n\n", cap=LINE_OVERHEAD + 20)
    @given(
        before=st.lists(st.sampled_from(LINES), max_size=4),
        chunk=st.lists(st.sampled_from(LINES), min_size=1, max_size=6),
        end=st.sampled_from([b"\n", b"\n\n", b""]),
        cap=st.sampled_from([1 << 20, LINE_OVERHEAD + 20]),
    )
    def test_same_as_feed(self, before, chunk, end, cap) -> None:
        fast, slow = SSEParser(cap), SSEParser(cap)
        opening = b"\n".join(before) + b"\n" if before else b": hello\n\n"
        fast.feed(opening)
        slow.feed(opening)
        data = b"\n".join(chunk) + end
        values = fast.whole_data(data)
        events = slow.feed(data)
        if values is None:  # nothing taken: feed reads it all, as if never offered
            assert fast.feed(data) == events
        else:
            assert values == [e.data.encode() for e in events]
            assert all(e.event == "message" and not e.comments for e in events)
        assert (fast.events, fast.oversized_events) == (slow.events, slow.oversized_events)
        fast.close()
        slow.close()
        assert fast.truncated_events == slow.truncated_events
