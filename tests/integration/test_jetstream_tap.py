"""One nats tap's sends on a real connection: the SPEC 9 headers, resends with
the same id (the rest of the tap's state: the unit test)."""

from __future__ import annotations

import time

import nats
import pytest

from shadow_proxy.worker.main.publishers.jetstream import JetStreamLink
from shadow_proxy.worker.main.publishers.jetstream_tap import (
    ACK_TIMEOUT_S,
    ack_timeout,
)
from shadow_proxy.worker.main.tap_queue import TapQueue
from tests.support.jetstream import nats_tap_config as config
from tests.support.jetstream import offer_records as offer

pytestmark = pytest.mark.timeout(60)


class TestSending:
    """Sends on a real connection carry the SPEC 9 headers; overdue records and a
    new connection send again with the same ``Nats-Msg-Id``."""

    async def test_headers_resend_and_leftovers(self, nats_server) -> None:
        cfg = config(nats_server.urls)
        link = JetStreamLink(cfg.nats)
        tap = link.publisher(TapQueue(cfg.taps[0]))
        nc = await nats.connect(nats_server.urls)
        try:
            seen = await nc.subscribe(tap.subject)
            offer(tap, 2)
            tap.pump()
            now = time.monotonic()
            tap.take_handover(now)
            await tap.send(nc, "_INBOX.r.0.", now)
            first = [await seen.next_msg(timeout=5) for _ in range(2)]
            assert [m.headers["Shadow-Seq"] for m in first] == ["0", "1"]
            assert first[1].headers == {
                "Shadow-Tap": "t",
                "Shadow-Publisher-Id": str(tap.publisher_id),
                "Nats-Expected-Stream": "SHADOW",
                "Nats-Msg-Id": f"{tap.publisher_id}.t.1",
                "Shadow-Seq": "1",
                "Shadow-Transport-Seq": "1",
            }
            assert first[0].reply == "_INBOX.r.0.0" and tap.leftovers() == (0, 2)
            tap.expire(now + ACK_TIMEOUT_S - 0.1)
            assert not tap.unsent  # not overdue yet
            tap.expire(now + ACK_TIMEOUT_S)
            await tap.send(nc, "_INBOX.r.0.", now + ACK_TIMEOUT_S)
            again = [await seen.next_msg(timeout=5) for _ in range(2)]
            assert [m.headers["Nats-Msg-Id"] for m in again] == [
                m.headers["Nats-Msg-Id"] for m in first
            ]
            assert tap.stats.retries == 2
            tap.resend_all()  # a new connection: both again, now their third attempt
            assert list(tap.unsent) == [0, 1]
            later = now + ACK_TIMEOUT_S
            await tap.send(nc, "_INBOX.r.0.", later)
            # The second attempt's timeout (4 s after it) is stale now: it sends nothing.
            tap.expire(later + ack_timeout(2))
            assert not tap.unsent
            tap.expire(later + ack_timeout(3))
            assert list(tap.unsent) == [0, 1]
        finally:
            await nc.close()
            link.loop.close()
