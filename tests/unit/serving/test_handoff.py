"""The hand-off's sending end: the byte bound, restarts, and what each message carries."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from prometheus_client import CollectorRegistry

from shadow_proxy.channel import frames as hf
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.serving.handoff import Capture, Handoff
from shadow_proxy.serving.metrics import ProxyMetrics


class TestByteBound:
    """A stalled worker costs at most max_bytes; drops are counted as full."""

    def test_bytes_in_flight_bounded_then_credit_restores(self, tmp_path):
        context = zmq.Context()
        registry = CollectorRegistry()
        metrics = ProxyMetrics.create(registry)
        handoff = Handoff(context, f"ipc://{tmp_path}/h", 1000, 100_000, metrics)
        pull = context.socket(zmq.PULL)
        pull.connect(handoff.endpoint)
        try:
            assert handoff._socket.poll(5000, zmq.POLLOUT), "the worker end never connected"
            body = b"x" * 10_000
            sent = [handoff.open(Route.CHAT, "r", body, 1, 1) for _ in range(20)]
            assert sum(c is not None for c in sent) == 9  # 9 x ~10 KB fit in 100 KB
            dropped = registry.get_sample_value("shadow_handoff_dropped_total", {"reason": "full"})
            assert dropped == 11
            received = 0
            for _ in range(9):
                received += sum(len(f) for f in pull.recv_multipart())
            handoff.acked_bytes = received  # what the worker reports as read
            assert handoff.open(Route.CHAT, "r", body, 1, 1) is not None
        finally:
            pull.close(linger=0)
            handoff.close()
            context.term()

    def test_restart_forgets_the_old_worker(self, tmp_path):
        context = zmq.Context()
        metrics = ProxyMetrics.create(CollectorRegistry())
        handoff = Handoff(context, f"ipc://{tmp_path}/h", 1000, 50, metrics)
        try:
            assert handoff.open(Route.CHAT, "r", b"y" * 100, 1, 1) is None
            assert handoff._lost_requests == 1
            handoff.restarted()
            assert handoff._lost_requests == 0
        finally:
            handoff.close()
            context.term()


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[tuple[Handoff, zmq.Socket, CollectorRegistry]]:
    """A hand-off with a real PULL socket connected, as the worker connects it."""
    context = zmq.Context()
    registry = CollectorRegistry()
    handoff = Handoff(
        context, f"ipc://{tmp_path}/h", 1000, 10_000_000, ProxyMetrics.create(registry)
    )
    pull = context.socket(zmq.PULL)
    pull.connect(handoff.endpoint)
    assert handoff._socket.poll(5000, zmq.POLLOUT), "the worker end never connected"
    try:
        yield handoff, pull, registry
    finally:
        pull.close(linger=0)
        handoff.close()
        context.term()


def receive(pull: zmq.Socket) -> list[bytes]:
    assert pull.poll(5000), "no message"
    return pull.recv_multipart()


class TestMessages:
    """What the worker reads: a request, chunk batches with the head, one end."""

    def test_request_message(self, channel) -> None:
        handoff, pull, _ = channel
        assert handoff.open(Route.COMPLETIONS, "rid-9", b'{"x": 1}', 111, 222) is not None
        first, request_id, body, *_ = receive(pull)
        kind, key, meta = hf.split_header(first)
        assert (kind, hf.KEY.unpack(key)) == (hf.KIND_REQUEST, (0,))
        assert hf.REQUEST_META.unpack(meta) == (Route.COMPLETIONS, 111, 222, 0)
        assert (request_id, body) == (b"rid-9", b'{"x": 1}')

    def test_a_short_stream_is_two_messages(self, channel) -> None:
        handoff, pull, _ = channel
        capture = handoff.open(Route.CHAT, "r", b"{}", 1, time.monotonic_ns())
        receive(pull)
        capture.head(200, "text/event-stream", "gzip")
        for chunk in (b"data: a\n\n", b"data: b\n\n"):
            capture.chunk(chunk)
        capture.end(EndKind.CLEAN)
        first, head, detail, index, data = receive(pull)
        kind, _, meta = hf.split_header(first)
        assert kind == hf.KIND_END and EndKind(hf.END_META.unpack(meta)[0]) is EndKind.CLEAN
        status, _, content_type, encoding = hf.unpack_head(head)
        assert (status, content_type, encoding, detail) == (200, "text/event-stream", "gzip", b"")
        pairs = hf.unpack_chunks(index, data)
        assert [c for c, _ in pairs] == [b"data: a\n\n", b"data: b\n\n"]
        offsets = [o for _, o in pairs]
        assert offsets == sorted(offsets) and offsets[0] >= 0
        assert not pull.poll(50)

    def test_chunks_are_batched_and_the_head_travels_once(self, channel) -> None:
        handoff, pull, _ = channel
        capture = handoff.open(Route.CHAT, "r", b"{}", 1, time.monotonic_ns())
        receive(pull)
        capture.head(200, "text/event-stream", "")
        n = Capture.BATCH_CHUNKS + 3
        for i in range(n):
            capture.chunk(b"c%d" % i)
        capture.end(EndKind.CLIENT_GONE, "gone")
        batch, end = receive(pull), receive(pull)
        assert hf.split_header(batch[0])[0] == hf.KIND_CHUNK
        assert hf.unpack_head(batch[1])[0] == 200
        assert len(hf.unpack_chunks(batch[2], batch[3])) == Capture.BATCH_CHUNKS
        assert end[1] == b"" and end[2] == b"gone"  # the head went with the batch
        assert len(hf.unpack_chunks(end[3], end[4])) == 3

    def test_without_joined_taps_only_the_tail_goes(self, channel) -> None:
        handoff, pull, _ = channel
        handoff.full_response = False
        capture = handoff.open(Route.CHAT, "r", b"{}", 1, time.monotonic_ns())
        receive(pull)
        for i in range(100):
            capture.chunk(b"c%d" % i)
        capture.end(EndKind.CLEAN)
        end = receive(pull)
        assert hf.split_header(end[0])[0] == hf.KIND_END
        tail = [c for c, _ in hf.unpack_chunks(end[3], end[4])]
        assert tail == [b"c98", b"c99"] and len(tail) == Capture.TAIL_CHUNKS

    def test_after_a_lost_message_the_end_says_capture_lost(self, channel) -> None:
        handoff, pull, registry = channel
        capture = handoff.open(Route.CHAT, "r", b"{}", 1, time.monotonic_ns())
        receive(pull)
        handoff.worker_alive = False  # the next batch is dropped (worker_dead)
        for i in range(Capture.BATCH_CHUNKS):
            capture.chunk(b"c%d" % i)
        handoff.worker_alive = True
        capture.chunk(b"after")  # not sent: the copy is no longer whole
        capture.end(EndKind.CLEAN)
        end = receive(pull)
        _, _, meta = hf.split_header(end[0])
        assert EndKind(hf.END_META.unpack(meta)[0]) is EndKind.CAPTURE_LOST
        assert hf.unpack_chunks(end[3], end[4]) == []
        dead = registry.get_sample_value("shadow_handoff_dropped_total", {"reason": "worker_dead"})
        assert dead == 1

    def test_a_lost_request_is_counted_in_the_next(self, channel) -> None:
        handoff, pull, _ = channel
        handoff.worker_alive = False
        assert handoff.open(Route.CHAT, "lost", b"{}", 1, 1) is None
        handoff.worker_alive = True
        handoff.open(Route.CHAT, "next", b"{}", 1, 1)
        first, request_id, *_ = receive(pull)
        assert request_id == b"next"
        assert hf.REQUEST_META.unpack(hf.split_header(first)[2])[3] == 1  # lost_before
        assert hf.KEY.unpack(hf.split_header(first)[1]) == (1,)  # keys never reused

    def test_close_sends_the_last_message(self, tmp_path: Path) -> None:
        context = zmq.Context()
        handoff = Handoff(
            context, f"ipc://{tmp_path}/h", 10, 1000, ProxyMetrics.create(CollectorRegistry())
        )
        pull = context.socket(zmq.PULL)
        pull.connect(handoff.endpoint)
        try:
            assert handoff._socket.poll(5000, zmq.POLLOUT)
            handoff.close()
            assert receive(pull) == [hf.LAST_MESSAGE]
        finally:
            pull.close(linger=0)
            context.term()
