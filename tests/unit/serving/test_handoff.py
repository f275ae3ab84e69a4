"""The hand-off's sending end: what each message carries, batches, the tail, a
lost message, the last message. (The Unix-socket transport, its byte bound and a
dead worker's accounting: test_handoff_stream.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from shadow_proxy.channel.handoff import KEY, Chunks, End, HandoffMessage, Head, Last, Request
from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.serving.handoff import Capture, Handoff
from shadow_proxy.serving.metrics import ProxyMetrics
from tests.support.handoff import HandoffReader


@pytest.fixture
async def channel(tmp_path) -> AsyncIterator[tuple[Handoff, HandoffReader, CollectorRegistry]]:
    """A hand-off with the worker's end connected (its hello read)."""
    registry = CollectorRegistry()
    handoff = Handoff(str(tmp_path / "h"), 10_000_000, ProxyMetrics.create(registry))
    await handoff.start()
    reader = HandoffReader(str(tmp_path / "h"))
    await wait_until(lambda: handoff.worker_alive and reader.read())
    reader.messages.clear()
    try:
        yield handoff, reader, registry
    finally:
        reader.close()
        handoff.close()
        await asyncio.sleep(0.05)


async def receive(reader: HandoffReader) -> HandoffMessage:
    await wait_until(reader.read, what="a message")
    return reader.messages.pop(0)


async def nothing_more(reader: HandoffReader) -> bool:
    await asyncio.sleep(0.05)
    return not reader.read()


class TestMessages:
    """What the worker reads: a request, chunk batches with the head, one end."""

    async def test_request_message(self, channel) -> None:
        handoff, reader, _ = channel
        capture = handoff.open(Route.COMPLETIONS, "rid-9", b'{"x": 1}', 111, 222, b"a:b\n", "gzip")
        assert capture is not None
        message = await receive(reader)
        assert message == Request(
            KEY.pack(0), Route.COMPLETIONS, 111, 222, 0, "rid-9", b'{"x": 1}', b"a:b\n", "gzip"
        )

    async def test_a_short_stream_is_two_messages(self, channel) -> None:
        handoff, reader, _ = channel
        arrival = time.monotonic_ns()
        capture = handoff.open(Route.CHAT, "r", b"{}", 1, arrival)
        await receive(reader)
        capture.head(200, "text/event-stream", "gzip", arrival + 5_000)
        for chunk in (b"data: a\n\n", b"data: b\n\n"):
            capture.chunk(chunk)
        capture.end(EndKind.CLEAN)
        end = await receive(reader)
        assert isinstance(end, End) and end.end is EndKind.CLEAN
        assert isinstance(end.head, Head)
        head = (end.head.status, end.head.content_type, end.head.content_encoding, end.detail)
        assert head == (200, "text/event-stream", "gzip", "")
        # the request went upstream, then the head came
        assert end.head.sent_offset_ns == 5_000 and end.head.offset_ns >= 5_000
        assert end.data.split() == [b"data: a\n\n", b"data: b\n\n"]
        assert end.offsets == sorted(end.offsets) and end.offsets[0] >= 0
        assert await nothing_more(reader)

    async def test_chunks_are_batched_and_the_head_travels_once(self, channel) -> None:
        handoff, reader, _ = channel
        capture = handoff.open(Route.CHAT, "r", b"{}", 1, time.monotonic_ns())
        await receive(reader)
        capture.head(200, "text/event-stream", "")
        n = Capture.BATCH_CHUNKS + 3
        for i in range(n):
            capture.chunk(b"c%d" % i)
        capture.end(EndKind.CLIENT_GONE, "gone")
        batch, end = await receive(reader), await receive(reader)
        assert isinstance(batch, Chunks) and isinstance(end, End)
        assert batch.head is not None and batch.head.status == 200
        assert len(batch.data) == Capture.BATCH_CHUNKS
        assert end.head is None and end.detail == "gone"  # the head went with the batch
        assert len(end.data) == 3

    async def test_without_joined_taps_only_the_tail_goes(self, channel) -> None:
        handoff, reader, _ = channel
        handoff.full_response = False
        capture = handoff.open(Route.CHAT, "r", b"{}", 1, time.monotonic_ns())
        await receive(reader)
        for i in range(100):
            capture.chunk(b"c%d" % i)
        capture.end(EndKind.CLEAN)
        end = await receive(reader)
        assert isinstance(end, End)
        assert end.data.split() == [b"c98", b"c99"] and len(end.data) == Capture.TAIL_CHUNKS

    async def test_after_a_lost_message_the_end_says_capture_lost(self, channel) -> None:
        handoff, reader, registry = channel
        capture = handoff.open(Route.CHAT, "r", b"{}", 1, time.monotonic_ns())
        await receive(reader)
        bound, handoff.max_bytes = handoff.max_bytes, 0  # the next batch is dropped (full)
        for i in range(Capture.BATCH_CHUNKS):
            capture.chunk(b"c%d" % i)
        handoff.max_bytes = bound
        capture.chunk(b"after")  # not sent: the copy is no longer whole
        capture.end(EndKind.CLEAN)
        end = await receive(reader)
        assert isinstance(end, End) and end.end is EndKind.CAPTURE_LOST
        assert end.data.split() == []
        full = registry.get_sample_value("shadow_handoff_dropped_total", {"reason": "full"})
        assert full == 1

    async def test_a_lost_request_is_counted_in_the_next(self, channel) -> None:
        handoff, reader, _ = channel
        bound, handoff.max_bytes = handoff.max_bytes, 0
        assert handoff.open(Route.CHAT, "lost", b"{}", 1, 1) is None
        handoff.max_bytes = bound
        handoff.open(Route.CHAT, "next", b"{}", 1, 1)
        request = await receive(reader)
        assert isinstance(request, Request) and request.request_id == "next"
        assert request.lost_before == 1
        assert request.key == KEY.pack(1)  # keys never reused

    async def test_close_sends_the_last_message(self, channel) -> None:
        handoff, reader, _ = channel
        handoff.close()
        assert await receive(reader) == Last()
