"""The ZeroMQ publisher on a real socket: SPEC framing, heartbeats, and a full
subscriber that keeps records in the tap queue instead of losing them in ZeroMQ."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from shadow_proxy.config.values import TapConfig
from shadow_proxy.records import wire
from shadow_proxy.records.filters import FilterSet
from shadow_proxy.worker.main.publishers.zeromq import Publisher
from shadow_proxy.worker.main.tap_queue import TapQueue

TOPIC = "shadow-requests-kv"


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.term()


def make_publisher(context: zmq.Context, capacity: int = 16) -> Publisher:
    config = TapConfig(
        "kv", TOPIC, "request", "tcp://127.0.0.1:*", FilterSet.parse([]), capacity=capacity
    )
    return Publisher(context, TapQueue(config))


def subscriber(context: zmq.Context, publisher: Publisher, rcvhwm: int = 1000) -> zmq.Socket:
    """A SUB socket, returned once the publisher has seen its subscription (no slow joiner)."""
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, rcvhwm)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.connect(publisher.endpoint)
    assert publisher.socket.poll(5000), "the subscription never reached the publisher"
    assert publisher.socket.recv() == b"\x01" + TOPIC.encode()
    return sub


def receive(sub: zmq.Socket) -> wire.Message:
    assert sub.poll(5000), "nothing arrived"
    return wire.decode_frames(sub.recv_multipart())


class TestPublishing:
    """Queued records go out in order, framed as SPEC section 4 says."""

    def test_records_are_framed_and_numbered(self, context: zmq.Context) -> None:
        publisher = make_publisher(context)
        sub = subscriber(context, publisher)
        try:
            for i in range(3):
                publisher.queue.offer(b"payload-%d" % i)
            assert publisher.pump() is False
            got = [receive(sub) for _ in range(3)]
            assert [m.payload for m in got] == [b"payload-0", b"payload-1", b"payload-2"]
            assert [m.sequence for m in got] == [0, 1, 2]
            assert {m.topic for m in got} == {TOPIC}
            assert {m.publisher_id for m in got} == {publisher.publisher_id}
            assert publisher.queue.published == 3 and not publisher.queue.items
        finally:
            sub.close(linger=0)
            publisher.close()

    def test_heartbeat(self, context: zmq.Context) -> None:
        publisher = make_publisher(context)
        sub = subscriber(context, publisher)
        try:
            publisher.heartbeat()
            first = receive(sub)
            assert first.topic == wire.heartbeat_topic(TOPIC) and first.sequence == 0
            beat = wire.Heartbeat.decode(first.payload)
            assert (beat.next_seq, beat.last_transport_sequence) == (0, None)
            for _ in range(2):
                publisher.queue.take_seq()
                publisher.queue.offer(b"r")
            publisher.queue.drop("handoff_full")  # takes a seq too
            publisher.pump()
            receive(sub), receive(sub)
            publisher.heartbeat()
            second = receive(sub)
            beat = wire.Heartbeat.decode(second.payload)
            assert second.sequence == 1  # heartbeats are numbered on their own
            assert (beat.tap, beat.publisher_id) == ("kv", publisher.publisher_id)
            assert (beat.next_seq, beat.last_transport_sequence) == (3, 1)
            assert (beat.queued, beat.published, beat.publish_errors) == (2, 2, 0)
            assert beat.dropped == {"handoff_full": 1}  # zero counts left out
        finally:
            sub.close(linger=0)
            publisher.close()

    def test_the_bound_endpoint_is_reported(self, context: zmq.Context) -> None:
        publisher = make_publisher(context)
        try:
            assert publisher.endpoint.startswith("tcp://127.0.0.1:")
            assert not publisher.endpoint.endswith(":*")
        finally:
            publisher.close()


class TestNotedBeforeSent:
    """A record counted sent before its send (``test_publishing.TestProgress``) is
    taken back when the send would block: the counts say what went out."""

    def test_a_blocked_send_is_taken_back(self, context: zmq.Context) -> None:
        publisher = make_publisher(context, capacity=2)
        notes: list[tuple[int, int]] = []
        publisher.on_sent = lambda: notes.append(
            (publisher.queue.published, publisher.next_transport_sequence)
        )
        sub = subscriber(context, publisher, rcvhwm=1)
        try:
            offered = 0
            while not publisher.pump():  # until a send would block
                assert offered < 2000, "the pipe never filled"
                publisher.queue.offer(b"x" * (256 * 1024))
                offered += 1
            published = publisher.queue.published
            assert notes[-1] == (published, published)  # the blocked one taken back
            assert notes[-2] == (published + 1, published + 1)
        finally:
            sub.close(linger=0)
            publisher.close()


class TestFullSubscriber:
    """A subscriber that does not read fills its pipe: the send fails, the record
    stays queued, and nothing is lost inside ZeroMQ."""

    def test_no_silent_drop(self, context: zmq.Context) -> None:
        publisher = make_publisher(context, capacity=2)
        sub = subscriber(context, publisher, rcvhwm=1)
        payload = b"x" * (256 * 1024)
        try:
            offered = 0
            while not publisher.pump():  # until a send would block
                assert offered < 2000, "the pipe never filled"
                publisher.queue.offer(payload)
                offered += 1
            waiting = len(publisher.queue.items)
            assert waiting >= 1
            assert publisher.queue.published == offered - waiting
            assert publisher.queue.publish_errors == 0
            sequences = []
            deadline = time.monotonic() + 30
            while len(sequences) < offered:  # read, and let the publisher send the rest
                assert time.monotonic() < deadline, f"{len(sequences)} of {offered} arrived"
                publisher.pump()
                if sub.poll(10):
                    sequences.append(wire.decode_frames(sub.recv_multipart()).sequence)
            assert sequences == list(range(offered))  # every record, in order, no gap
            assert publisher.queue.published == offered and not publisher.queue.items
        finally:
            sub.close(linger=0)
            publisher.close()
