"""One ``nats`` tap's state, driven step by step as the two threads drive it: the
worker's ``pump`` bounded by the window, the link's hand-over, sends with the
SPEC 9 headers on a real connection, acknowledgements, timeouts and resends,
heartbeats only when the numbers changed, and what is left at close."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from nats.aio.msg import Msg

from shadow_proxy.records.wire import Heartbeat
from shadow_proxy.worker.main.publishers.jetstream import JetStreamLink
from shadow_proxy.worker.main.publishers.jetstream_tap import (
    ACK_TIMEOUT_S,
    RETRY_MAX_S,
    JetStreamPublisher,
    ack_timeout,
)
from shadow_proxy.worker.main.tap_queue import TapQueue
from tests.support.jetstream import nats_tap_config as config
from tests.support.jetstream import offer_records as offer
from tests.support.jetstream import synthetic_payload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tap() -> Iterator[JetStreamPublisher]:
    """A publisher on a link whose thread is not started: the test plays both threads."""
    cfg = config(["nats://127.0.0.1:9"])
    link = JetStreamLink(cfg.nats)
    publisher = link.publisher(TapQueue(cfg.taps[0]))
    yield publisher
    link.loop.close()


def reply(data: object, headers: dict[str, str] | None = None) -> Msg:
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    return Msg(None, subject="_INBOX.x", data=body, headers=headers)  # type: ignore[arg-type]


class TestPure:
    """The resend schedule."""

    def test_ack_timeout_doubles_up_to_the_cap(self) -> None:
        assert [ack_timeout(a) for a in (1, 2, 3, 4)] == [ACK_TIMEOUT_S, 4.0, 8.0, RETRY_MAX_S]


class TestWindow:
    """``pump`` hands over at most ``capacity`` unsettled records and never waits."""

    def test_bounded_by_capacity(self, tap: JetStreamPublisher) -> None:
        offer(tap, 4)
        assert tap.pump() is False
        offer(tap, 2)
        assert tap.pump() is True  # two wait in the queue
        assert (len(tap.handover), len(tap.queue.items), tap.in_flight) == (4, 2, 4)
        tap.take_handover(time.monotonic())
        assert sorted(tap.window) == [0, 1, 2, 3] and list(tap.unsent) == [0, 1, 2, 3]
        assert [f.transport_sequence for f in tap.window.values()] == [0, 1, 2, 3]
        assert tap.pump() is True  # the window is still full

    def test_settled_records_make_room(self, tap: JetStreamPublisher) -> None:
        offer(tap, 4)
        tap.pump()
        offer(tap, 1)
        tap.take_handover(time.monotonic())
        assert tap.on_reply(0, reply({"stream": "SHADOW", "seq": 1}), time.monotonic())
        assert (tap.queue.published, tap.in_flight) == (1, 3)
        assert tap.pump() is False and tap.in_flight == 4

    def test_the_seq_travels_with_the_record(self, tap: JetStreamPublisher) -> None:
        """The window is keyed by the seq the main took (never read back from the
        payload): a record's acknowledgement settles that record."""
        for seq in (5, 9):
            tap.queue.offer(synthetic_payload("t", 0), seq=seq)
        tap.pump()
        tap.take_handover(time.monotonic())
        assert sorted(tap.window) == [5, 9]


class TestAcknowledgements:
    """An ack settles; a refusal is counted and resent later; a 503 means no stream."""

    def settle_setup(self, tap: JetStreamPublisher) -> None:
        offer(tap, 2)
        tap.pump()
        tap.take_handover(time.monotonic())

    def test_refused_stays_in_the_window(self, tap: JetStreamPublisher) -> None:
        self.settle_setup(tap)
        error = {"error": {"code": 503, "description": "insufficient resources"}}
        assert tap.on_reply(1, reply(error), time.monotonic()) is True
        assert (tap.queue.publish_errors, 1 in tap.window) == (1, True)
        assert tap.on_reply(1, reply(b"not json"), time.monotonic()) is True
        assert tap.queue.publish_errors == 2 and 1 in tap.window

    def test_no_responders_is_a_missing_stream(self, tap: JetStreamPublisher) -> None:
        self.settle_setup(tap)
        assert tap.on_reply(0, reply(b"", {"Status": "503"}), time.monotonic()) is False
        assert 0 in tap.window

    def test_a_late_answer_to_a_settled_record(self, tap: JetStreamPublisher) -> None:
        self.settle_setup(tap)
        assert tap.on_reply(0, reply({"seq": 1}), time.monotonic())
        assert tap.on_reply(0, reply({"seq": 1}), time.monotonic())
        assert tap.queue.published == 1 and tap.stats.ack_seconds.counts[-1] == 0


class TestHeartbeat:
    """A heartbeat is queued when the numbers changed (or forced at close)."""

    def test_only_when_changed(self, tap: JetStreamPublisher) -> None:
        tap.heartbeat()
        payload = tap.take_heartbeat()
        assert payload is not None and Heartbeat.decode(payload).next_seq == 0
        tap.next_heartbeat = 0.0  # the interval has passed
        tap.heartbeat()
        assert tap.take_heartbeat() is None  # nothing changed
        offer(tap, 1)
        tap.heartbeat()
        beat = Heartbeat.decode(tap.take_heartbeat() or b"")
        assert (beat.next_seq, beat.queued, beat.publisher_id) == (1, 1, tap.publisher_id)
        tap.heartbeat(force=True)
        assert tap.take_heartbeat() is not None
