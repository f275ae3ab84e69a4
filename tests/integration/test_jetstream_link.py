"""The JetStream link (SPEC 9) against a real nats-server: the message format,
the stream it creates or checks at start-up, the ack window's bound, drops
while the server does not answer, a server that is not there at start, and
what is left at close.

The link runs as the worker runs it: its thread publishes, and this thread
plays the worker's loop (``offer`` then ``pump``).
"""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats.js import api

from shadow_proxy.config import Config
from shadow_proxy.devtools.nats_server import NatsCluster
from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records.wire import Heartbeat, decode_envelope
from shadow_proxy.worker.main.publishers.jetstream import JetStreamLink
from shadow_proxy.worker.main.publishers.jetstream_stream import DUPLICATE_WINDOW_S
from tests.support.jetstream import DirectPublisher, tap_messages
from tests.support.nats import stream_info

pytestmark = [pytest.mark.nats, pytest.mark.timeout(60)]

SUBJECT = "shadow.shadow-requests-direct"


@pytest.fixture
def direct(nats_server):
    publisher = DirectPublisher(nats_server.urls)
    yield publisher
    publisher.close()


class TestMessages:
    """Each record is one message: the envelope's bytes and the SPEC 9 headers."""

    async def test_headers_and_data(self, nats_server, direct):
        assert direct.startup_problem() is None
        direct.offer(50)
        await wait_until(lambda: direct.queue.published == 50, timeout=10)
        messages = await tap_messages(nats_server.urls, SUBJECT)
        assert len(messages) == 50
        publisher_id = direct.publisher.publisher_id
        for seq, message in enumerate(messages):
            assert message.headers["Nats-Msg-Id"] == f"{publisher_id}.direct.{seq}"
            assert message.headers["Shadow-Seq"] == str(seq)
            assert message.headers["Shadow-Tap"] == "direct"
            assert message.headers["Shadow-Publisher-Id"] == str(publisher_id)
            envelope = decode_envelope(message.data)
            assert (envelope["tap"], envelope["seq"]) == ("direct", seq)
        assert direct.queue.dropped["full"] == 0
        assert direct.queue.publish_errors == 0

    async def test_stream_created_from_the_section(self, nats_server, direct):
        assert direct.startup_problem() is None
        info = await stream_info(nats_server.urls, "SHADOW")
        config = info.config
        assert config.subjects == ["shadow.>"]
        assert (config.num_replicas, config.max_bytes) == (1, 256 * 2**20)
        assert config.max_age == 7 * 86400
        assert config.discard == api.DiscardPolicy.OLD
        assert config.duplicate_window == DUPLICATE_WINDOW_S
        assert config.storage == api.StorageType.FILE


class TestStreamCheck:
    """An existing stream is checked: one that misses the taps' subjects is refused."""

    async def test_stream_not_covering_the_subjects(self, nats_server):
        nc = await nats.connect(nats_server.urls)
        await nc.jetstream().add_stream(name="SHADOW", subjects=["other.>"])
        await nc.close()
        publisher = DirectPublisher(nats_server.urls)
        try:
            problem = await asyncio.to_thread(publisher.startup_problem)
        finally:
            publisher.close()
        assert problem is not None
        for part in ("'SHADOW'", "other.>", SUBJECT, "heartbeat"):
            assert part in problem, problem
        assert publisher.link.stats.stream_problems["subjects"] >= 1

    async def test_stream_covering_the_subjects_is_used_as_it_is(self, nats_server):
        nc = await nats.connect(nats_server.urls)
        await nc.jetstream().add_stream(name="SHADOW", subjects=["shadow.*", "shadow.*.*"])
        await nc.close()
        publisher = DirectPublisher(nats_server.urls)
        try:
            assert await asyncio.to_thread(publisher.startup_problem) is None
            publisher.offer(3)
            await wait_until(lambda: publisher.queue.published == 3, timeout=10)
        finally:
            publisher.close()
        info = await stream_info(nats_server.urls, "SHADOW")
        assert info.config.subjects == ["shadow.*", "shadow.*.*"]


class TestBounds:
    """A server that stops answering fills the window, then the queue; the rest is
    dropped and counted ``full``; nothing waits; retries are stored once."""

    async def test_paused_server(self, nats_server):
        capacity = 16
        direct = DirectPublisher(nats_server.urls, capacity=capacity)
        try:
            assert direct.startup_problem() is None
            direct.offer(10)
            await wait_until(lambda: direct.queue.published == 10, timeout=10)
            server = nats_server.servers[0]
            server.pause()
            slowest = 0.0
            for _ in range(100):
                started_at = time.perf_counter()
                direct.offer(1)
                slowest = max(slowest, time.perf_counter() - started_at)
                assert direct.publisher.in_flight <= capacity
                assert len(direct.queue.items) <= capacity
            # Never waits on the server: a pump that did would sit out one of the
            # link's timeouts (2 s and up); the margin below is for a loaded host.
            assert slowest < 0.5, f"offer+pump took {slowest * 1000:.1f} ms"
            assert direct.publisher.in_flight == capacity
            assert direct.queue.dropped["full"] == 100 - 2 * capacity
            # Past the ack timeout the window is sent again (to a server that
            # does not answer): the resends are what JetStream must store once.
            await wait_until(lambda: direct.publisher.stats.retries > 0, timeout=10)
            server.resume()

            def drained() -> bool:
                direct.pump()
                return not direct.queue.items and direct.publisher.in_flight == 0

            await wait_until(drained, timeout=20)
        finally:
            direct.close()
        assert direct.queue.published == 10 + 2 * capacity
        assert direct.publisher.stats.retries > 0
        messages = await tap_messages(nats_server.urls, SUBJECT)
        seqs = [int(m.headers["Shadow-Seq"]) for m in messages]
        assert len(seqs) == len(set(seqs)) == 10 + 2 * capacity
        assert set(seqs) == set(range(10 + 2 * capacity))


class TestNoServerAtStart:
    """No server answering at start costs a bounded wait; publishing starts when
    one appears, and the stream is created then."""

    async def test_server_arrives_later(self, tmp_path):
        cluster = NatsCluster.create(tmp_path / "nats", 1)
        direct = DirectPublisher(cluster.urls)
        try:
            started_at = time.monotonic()
            assert direct.startup_problem(budget_s=1.0) is None
            assert time.monotonic() - started_at < 3.0
            direct.offer(5)
            assert direct.publisher.in_flight == 5
            assert direct.link.stats.connected is False
            cluster.start()
            await wait_until(lambda: direct.queue.published == 5, timeout=20)
            messages = await tap_messages(cluster.urls, SUBJECT)
            assert [m.headers["Shadow-Seq"] for m in messages] == ["0", "1", "2", "3", "4"]
        finally:
            direct.close()
            cluster.stop()


class TestClose:
    """At close the last heartbeat goes to the stream, and what was never
    acknowledged is counted as dropped (``unacked``: it may be in the stream)."""

    async def test_last_heartbeat(self, nats_server):
        direct = DirectPublisher(nats_server.urls)
        assert direct.startup_problem() is None
        direct.offer(2)
        await wait_until(lambda: direct.queue.published == 2, timeout=10)
        direct.close()
        [beat] = await tap_messages(nats_server.urls, SUBJECT + ".heartbeat")
        heartbeat = Heartbeat.decode(beat.data)
        assert (heartbeat.tap, heartbeat.next_seq, heartbeat.published) == ("direct", 2, 2)
        assert heartbeat.publisher_id == direct.publisher.publisher_id

    async def test_unacknowledged_counted(self, nats_server):
        """Records held at close are dropped and counted: ``unacked`` when sent
        (they may be in the stream), ``closed`` when never sent (a paused server
        may be declared stale by then). Which is which: test_jetstream_tap.py."""
        direct = DirectPublisher(nats_server.urls, capacity=8)
        server = nats_server.servers[0]
        try:
            assert direct.startup_problem() is None
            server.pause()
            direct.offer(5)
            await wait_until(lambda: len(direct.publisher.window) == 5, timeout=10)
            direct.close()
        finally:
            server.resume()
        dropped = direct.queue.dropped
        assert dropped["unacked"] + dropped["closed"] == 5, dropped
        assert direct.publisher.in_flight == 0 and direct.queue.published == 0

    async def test_never_sent_counted_closed(self, tmp_path):
        cluster = NatsCluster.create(tmp_path / "nats", 1)  # never started: nobody answers
        direct = DirectPublisher(cluster.urls)
        assert direct.startup_problem(budget_s=1.0) is None
        direct.offer(3)
        direct.close()
        dropped = direct.queue.dropped
        assert (dropped["closed"], dropped.get("unacked", 0)) == (3, 0)
        assert direct.publisher.in_flight == 0

    def test_no_link_without_a_nats_tap(self):
        config = Config.from_mapping(
            {
                "schema_version": 1,
                "upstream": {"url": "http://127.0.0.1:9"},
                "nats": {"servers": ["nats://127.0.0.1:9"]},
                "taps": [{"name": "a", "capture": "request"}],
            }
        )
        assert JetStreamLink.for_config(config) is None
