"""A tap's messages for the consumer tests: records and heartbeats framed as a
tap publishes them (SPEC 4), and a raw PUB socket that sends them."""

from __future__ import annotations

import contextlib
import time

import zmq

from shadow_proxy.records import envelope as records
from shadow_proxy.records import wire

TOPIC = "shadow-requests-a"


def record_frames(
    seq: int,
    *,
    publisher: int = 1,
    transport: int | None = None,
    topic: str = TOPIC,
    tokens: int = 3,
    response: dict | None = None,
    **overrides,
) -> list[bytes]:
    envelope = records.build_envelope(
        tap="a",
        seq=seq,
        request_id=f"req-{seq}",
        origin="chat",
        filters=["strip-worker-pins"],
        arrival_unix_ns=1,
        sample_rate=1.0,
        request={"model": "m", "token_ids": list(range(tokens))},
        response=response,
    )
    envelope.update(overrides)
    payload = wire.encode_envelope(envelope)
    return wire.encode_frames(topic, publisher, seq if transport is None else transport, 0, payload)


@contextlib.contextmanager
def publisher():
    context = zmq.Context()
    sock = context.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    try:
        yield sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        sock.close(linger=0)
        context.term()


def publish_until(sock, done, *, timeout: float = 10.0) -> int:
    """Send records (and a sibling topic's) until ``done()``; slow joiners miss the first."""
    deadline = time.monotonic() + timeout
    seq = 0
    while not done():
        assert time.monotonic() < deadline, "consumer did not finish"
        sock.send_multipart(record_frames(seq, tokens=2))
        sock.send_multipart(record_frames(seq, topic=TOPIC + "b", publisher=99))
        seq += 1
        time.sleep(0.01)
    return seq


def heartbeat_frames(
    next_seq: int, last_transport: int | None, *, publisher: int = 1, beat: int = 0
) -> list[bytes]:
    payload = wire.Heartbeat("a", publisher, next_seq, last_transport, dropped={"full": 1}).encode()
    return wire.encode_frames(wire.heartbeat_topic(TOPIC), publisher, beat, 0, payload)
