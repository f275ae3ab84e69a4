"""The worker's one authority over seqs: every record's seq written into it, claimed in
the checkpoint before it is sent and noted there as it is sent; late records dropped,
not sent; a dead predecessor's final state announced on its publisher id."""

from __future__ import annotations

import time

import pytest
import zmq
from prometheus_client import CollectorRegistry

from shadow_proxy.channel import checkpoint as cp
from shadow_proxy.channel import control
from shadow_proxy.channel.handoff import Hello
from shadow_proxy.config import Config
from shadow_proxy.devtools.processes import reserve_endpoint
from shadow_proxy.exchange import DropReason
from shadow_proxy.records import wire
from shadow_proxy.records.envelope import build_envelope
from shadow_proxy.worker.main.publishing import Publishing
from shadow_proxy.worker.shard.encoding import encode_record
from shadow_proxy.worker.sink import EncodedRecord


def config(max_lag_s: float | None = 30.0) -> Config:
    return Config.from_mapping(
        {
            "schema_version": 1,
            "upstream": {"url": "http://127.0.0.1:1"},
            "worker": {"max_lag_s": max_lag_s},
            "taps": [{"name": "kv", "capture": "request", "endpoint": reserve_endpoint()}],
        }
    )


def payload(request_id: str) -> EncodedRecord:
    """An envelope as a shard encodes it: its seq left to the main."""
    envelope = build_envelope(
        tap="kv",
        seq=None,
        request_id=request_id,
        origin="chat",
        filters=[],
        arrival_unix_ns=1,
        sample_rate=1.0,
        request={"token_ids": [1, 2]},
        response=None,
    )
    return encode_record(envelope)


@pytest.fixture
def setup(tmp_path):
    context = zmq.Context()
    registry = CollectorRegistry()
    cfg = config(max_lag_s=1.0)
    path = tmp_path / "checkpoint"
    publishing = Publishing(cfg, context, registry, generation=4, checkpoint_path=path)
    sub = context.socket(zmq.SUB)
    sub.connect(cfg.taps[0].endpoint)
    sub.subscribe(b"")
    # Connected once a heartbeat gets through (no slow joiner).
    deadline = time.monotonic() + 5
    while not sub.poll(100):
        publishing.heartbeat()
        assert time.monotonic() < deadline
    while sub.poll(0):
        sub.recv_multipart()
    yield publishing, sub, registry, path
    sub.close(linger=0)
    publishing.close()
    context.term()


def received(sub) -> list[wire.Message]:
    messages = []
    while sub.poll(300):
        messages.append(wire.decode_frames(sub.recv_multipart()))
    return messages


def envelopes(messages: list[wire.Message]) -> list[dict]:
    return [wire.decode_envelope(m.payload) for m in messages if m.topic == "shadow-requests-kv"]


class TestSeqs:
    def test_seq_written_into_each_record(self, setup):
        publishing, sub, _, _ = setup
        for i in range(3):
            publishing.record(0, payload(f"r{i}"), time.monotonic_ns())
        publishing.pump()
        records = [
            wire.decode_envelope(m.payload)
            for m in received(sub)
            if m.topic == "shadow-requests-kv"
        ]
        assert [(r["seq"], r["request_id"]) for r in records] == [(0, "r0"), (1, "r1"), (2, "r2")]

    def test_losses_take_seqs_and_add_up(self, setup):
        publishing, _, _, _ = setup
        publishing.record(0, payload("r"), time.monotonic_ns())
        publishing.drop(0, DropReason.ENCODE_ERROR)  # a shard could not encode it
        publishing.drop_request(DropReason.WORKER_DIED)
        publishing.count_lost(3)
        publishing.count_lost(3)  # the same count again: nothing more
        queue = publishing.queues[0]
        assert queue.dropped["encode_error"] == 1
        assert queue.dropped["worker_died"] == 1 and queue.dropped["handoff_full"] == 3
        assert queue.next_seq == 6 == queue.queued + sum(queue.dropped.values())
        assert publishing.resolved == [1]  # only the request handed over on this connection


class TestClaims:
    """Nothing is sent that the checkpoint does not claim."""

    def test_checkpoint_claims_before_each_send(self, setup):
        publishing, sub, _, path = setup
        publisher = publishing.publishers[0]
        send = publisher.socket.send_multipart
        seen = []

        def checked_send(frames, *args, **kwargs):
            claimed = cp.read_checkpoint(path).taps[0].next_seq
            seq = wire.decode_envelope(wire.decode_frames(frames).payload)["seq"]
            seen.append((seq, claimed))
            return send(frames, *args, **kwargs)

        publisher.socket = _Spy(publisher.socket, checked_send)  # type: ignore[assignment]
        for i in range(5):
            publishing.record(0, payload(f"r{i}"), time.monotonic_ns())
            if i % 2:
                publishing.pump()
        publishing.pump()
        assert [seq for seq, _ in seen] == list(range(5))
        assert all(seq < claimed for seq, claimed in seen), seen
        state = cp.read_checkpoint(path)
        assert state.generation == 4
        assert state.taps[0].published == 5 and state.taps[0].next_seq == 5


class _Spy:
    """A socket whose ``send_multipart`` is observed (everything else as it is)."""

    def __init__(self, socket, send_multipart):
        self._socket = socket
        self.send_multipart = send_multipart

    def __getattr__(self, name):
        return getattr(self._socket, name)


class TestLate:
    """A queued record older than max_lag_s is dropped (late), not sent."""

    def test_old_records_dropped_fresh_sent_lag_observed(self, setup):
        publishing, sub, registry, _ = setup
        now = time.monotonic_ns()
        for i, age_s in enumerate((5.0, 0.2, 3.0, 0.0)):
            publishing.record(0, payload(f"r{i}"), now - int(age_s * 1e9))
        publishing.pump()
        records = [
            wire.decode_envelope(m.payload)
            for m in received(sub)
            if m.topic == "shadow-requests-kv"
        ]
        assert [r["request_id"] for r in records] == ["r1", "r3"]
        assert [r["seq"] for r in records] == [1, 3]  # the late ones leave gaps
        assert publishing.queues[0].dropped["late"] == 2
        value = registry.get_sample_value
        assert value("shadow_worker_late_total", {"stage": "queue"}) == 2
        assert value("shadow_tap_record_lag_seconds_count", {"tap": "kv"}) == 2
        assert value("shadow_tap_record_lag_seconds_bucket", {"tap": "kv", "le": "0.25"}) == 2


class TestLastWords:
    """A dead predecessor's final state goes out on its own publisher id."""

    def test_tombstone_heartbeat(self, setup):
        publishing, sub, _, _ = setup
        dead = cp.TapState(
            name="kv",
            publisher_id=77,
            next_seq=12,
            published=2,
            next_transport=2,
            dropped={"worker_died": 10},
        )
        publishing.on_hello(Hello(2, 0, (dead, cp.TapState(name="gone", publisher_id=78))))
        publishing.heartbeat()
        beats = [
            wire.Heartbeat.decode(m.payload)
            for m in received(sub)
            if m.topic == "shadow-requests-kv.heartbeat"
        ]
        own = publishing.publishers[0].publisher_id
        assert {hb.publisher_id for hb in beats} == {own, 77}
        (last,) = [hb for hb in beats if hb.publisher_id == 77]
        assert last.next_seq == 12 and last.dropped == {"worker_died": 10}
        assert last.last_transport_sequence == 1


class TestListingAndDrain:
    """Each tap's queue goes out on its own socket; the listing shows every counter;
    at shutdown what is queued is published in time or counted as closed."""

    def test_listing(self) -> None:
        context = zmq.Context()
        cfg = Config.from_mapping(
            {
                "schema_version": 1,
                "upstream": {"url": "http://127.0.0.1:1"},
                "taps": [
                    {"name": n, "capture": "request", "endpoint": f"inproc://{n}"}
                    for n in ("kv", "replay")
                ],
            }
        )
        publishing = Publishing(cfg, context, CollectorRegistry())
        try:
            publishing.record(0, payload("r"), time.monotonic_ns())
            kv, replay = control.listing(publishing.tap_info(), publishing.tap_counters())
            assert set(kv) == {
                "name",
                "topic",
                "endpoint",
                "capture",
                "filters",
                "models",
                "sample",
                "capacity",
                "publisher_id",
                "next_seq",
                "queued",
                "published",
                "dropped",
                "skipped",
                "publish_errors",
                "queue_depth",
                "transport",
                "curve",
            }
            assert (kv["name"], kv["endpoint"], kv["next_seq"], kv["queue_depth"]) == (
                "kv",
                "inproc://kv",
                1,
                1,
            )
            assert kv["publisher_id"] != replay["publisher_id"]
            assert (kv["transport"], replay["next_seq"]) == ("zmq", 0)
        finally:
            publishing.close()
            context.term()

    def test_drain_publishes_then_closes(self, setup) -> None:
        publishing, sub, _, path = setup
        for i in range(3):
            publishing.record(0, payload(f"r{i}"), time.monotonic_ns())
        assert publishing.drain(2.0) == 0  # everything published in time
        assert [r["request_id"] for r in envelopes(received(sub))] == ["r0", "r1", "r2"]
        queue = publishing.queues[0]
        assert queue.closed and not queue.offer(b"late")
        assert queue.dropped["closed"] == 1
        assert cp.read_checkpoint(path).taps[0].published == 3


class TestProgress:
    """Each send is in the checkpoint before it is made, not at the batch's end: a
    worker killed anywhere in a batch never delivered a record its checkpoint
    calls unsent (that one would be counted lost as well as delivered)."""

    def test_every_send_noted_before_it_is_made(self, setup):
        publishing, _, _, path = setup
        publisher = publishing.publishers[0]
        send = publisher.socket.send_multipart
        published_before_each_send = []

        def checked_send(frames, *args, **kwargs):
            published_before_each_send.append(cp.read_checkpoint(path).taps[0].published)
            return send(frames, *args, **kwargs)

        publisher.socket = _Spy(publisher.socket, checked_send)  # type: ignore[assignment]
        for i in range(4):
            publishing.record(0, payload(f"r{i}"), time.monotonic_ns())
        publishing.pump()  # one batch of four sends
        assert published_before_each_send == [1, 2, 3, 4]
        state = cp.read_checkpoint(path).taps[0]
        assert (state.published, state.next_transport, state.unsent) == (4, 4, 0)
