"""A tap's records read from JetStream with a durable pull consumer, against a
real nats-server: what is not a record of the tap is counted, acknowledged and
skipped; redeliveries are yielded once; the transport fields come from the
publisher's headers; a missing stream or a durable of another tap is refused."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import nats
import nats.js
import pytest
from nats.js import api

from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records.jetstream_source import HINT_AFTER_S, JetStreamSource, default_subject
from shadow_proxy.records.sources import Delivery, SourceError
from shadow_proxy.records.wire import Heartbeat, encode_envelope, heartbeat_topic
from tests.support.jetstream import synthetic_payload
from tests.support.nats import messages_in

pytestmark = [pytest.mark.nats, pytest.mark.timeout(60)]

TAP = "direct"

SUBJECT = "shadow.shadow-requests-direct"


@contextlib.asynccontextmanager
async def shadow_stream(urls: list[str]) -> AsyncIterator[nats.js.JetStreamContext]:
    """The SHADOW stream (``shadow.>``) created, and a JetStream context to fill it."""
    nc = await nats.connect(urls)
    try:
        js = nc.jetstream()
        await js.add_stream(name="SHADOW", subjects=["shadow.>"])
        yield js
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def reading(source: JetStreamSource) -> AsyncIterator[AsyncIterator[Delivery]]:
    """The source's deliveries; the iterator and the source closed on the way out."""
    deliveries = source.deliveries()
    try:
        yield deliveries
    finally:
        await deliveries.aclose()
        await source.aclose()


class TestNotRecords:
    """Messages on the tap's subjects that are not its records are counted by
    reason, acknowledged (never delivered again) and skipped."""

    async def test_rejected(self, nats_server):
        async with shadow_stream(nats_server.urls) as js:
            good = {"Shadow-Tap": TAP, "Shadow-Publisher-Id": "7", "Shadow-Seq": "0"}
            await js.publish(SUBJECT, synthetic_payload(TAP, 0), headers=good)
            await js.publish(SUBJECT, b"\xc1 not msgpack", headers={**good, "Shadow-Seq": "1"})
            await js.publish(SUBJECT, synthetic_payload(TAP, 2), headers={"Shadow-Tap": TAP})
            other = {**good, "Shadow-Tap": "other", "Shadow-Seq": "3"}
            await js.publish(SUBJECT, synthetic_payload("other", 3), headers=other)
            await js.publish(
                SUBJECT, encode_envelope({"tap": TAP}), headers={**good, "Shadow-Seq": "4"}
            )
            await js.publish(SUBJECT, synthetic_payload(TAP, 0), headers=good)  # a repeat
            await js.publish(
                SUBJECT, synthetic_payload(TAP, 5), headers={**good, "Shadow-Seq": "5"}
            )

        source = JetStreamSource(nats_server.urls, "SHADOW", TAP, "strict", ack_wait_s=1)
        async with reading(source) as deliveries:
            got = []
            for _ in range(2):
                delivery = await asyncio.wait_for(anext(deliveries), 5)
                got.append((delivery.message.publisher_id, delivery.envelope["seq"]))
                await delivery.ack()
            assert got == [(7, 0), (7, 5)]
            assert source.stats.unreadable == {"envelope": 1, "headers": 1, "tap": 1, "record": 1}
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(deliveries), 1.5)
            # Only the repeat: the acknowledged records were not delivered again.
            assert source.stats.duplicates == 1
        # A second reader on the same durable gets nothing again within three times
        # the ack wait: all was acknowledged (what was not would come again).
        again = JetStreamSource(nats_server.urls, "SHADOW", TAP, "strict", ack_wait_s=1)
        async with reading(again) as stream:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(stream), 3)


class TestDeliveries:
    """Records and heartbeats as deliveries, with the publisher's transport fields."""

    async def test_transport_fields_and_heartbeats(self, nats_server):
        async with shadow_stream(nats_server.urls) as js:
            headers = {
                "Shadow-Tap": TAP,
                "Shadow-Publisher-Id": "9",
                "Shadow-Seq": "3",
                "Shadow-Transport-Seq": "41",
            }
            await js.publish(SUBJECT, synthetic_payload(TAP, 3), headers=headers)
            beat = Heartbeat(
                tap=TAP,
                publisher_id=9,
                next_seq=4,
                last_transport_sequence=41,
                queued=0,
                published=4,
                dropped={},
                publish_errors=0,
            )
            beat_headers = {"Shadow-Tap": TAP, "Shadow-Publisher-Id": "9"}
            await js.publish(heartbeat_topic(SUBJECT), beat.encode(), headers=beat_headers)

        source = JetStreamSource(nats_server.urls, "SHADOW", TAP, "fields", heartbeats=True)
        async with reading(source) as deliveries:
            record = await asyncio.wait_for(anext(deliveries), 5)
            assert (record.message.publisher_id, record.message.sequence) == (9, 41)
            assert record.message.topic == SUBJECT and record.message.published_at_ms > 0
            assert record.envelope["seq"] == 3 and record.where == "SHADOW#1"
            await record.ack()
            heartbeat = await asyncio.wait_for(anext(deliveries), 5)
            assert heartbeat.heartbeat == beat and heartbeat.envelope is None
            assert (source.stats.records, source.stats.heartbeats) == (1, 1)

    async def test_unacknowledged_is_delivered_again(self, nats_server):
        async with shadow_stream(nats_server.urls) as js:
            headers = {"Shadow-Tap": TAP, "Shadow-Publisher-Id": "1", "Shadow-Seq": "0"}
            await js.publish(SUBJECT, synthetic_payload(TAP, 0), headers=headers)
        first = JetStreamSource(nats_server.urls, "SHADOW", TAP, "again", ack_wait_s=1)
        async with reading(first) as stream:
            await asyncio.wait_for(anext(stream), 5)  # not acknowledged
        second = JetStreamSource(nats_server.urls, "SHADOW", TAP, "again", ack_wait_s=1)
        async with reading(second) as stream:
            delivery = await asyncio.wait_for(anext(stream), 10)
            assert delivery.envelope["seq"] == 0
            await delivery.ack()


async def publish_records(js: nats.js.JetStreamContext, count: int, first: int = 0) -> None:
    for seq in range(first, first + count):
        headers = {"Shadow-Tap": TAP, "Shadow-Publisher-Id": "3", "Shadow-Seq": str(seq)}
        await js.publish(SUBJECT, synthetic_payload(TAP, seq), headers=headers)


class TestStopAtEnd:
    """``--stop-at-end``: a batch read of what the stream holds ends there (a live
    reader never did), and an acknowledgement holds no record."""

    async def test_ends_at_the_end(self, nats_server):
        async with shadow_stream(nats_server.urls) as js:
            await publish_records(js, 5)
        source = JetStreamSource(nats_server.urls, "SHADOW", TAP, "batch", stop_at_end=True)
        assert source.live is False
        seqs = []
        async with reading(source) as deliveries:
            async with asyncio.timeout(20):
                async for delivery in deliveries:
                    seqs.append(delivery.envelope["seq"])
                    await delivery.ack()
        assert seqs == [0, 1, 2, 3, 4]
        # The next run on the durable resumes past them, and ends at once.
        async with shadow_stream_more(nats_server.urls) as js:
            await publish_records(js, 2, first=5)
        again = JetStreamSource(nats_server.urls, "SHADOW", TAP, "batch", stop_at_end=True)
        async with reading(again) as deliveries, asyncio.timeout(20):
            assert [d.envelope["seq"] async for d in deliveries] == [5, 6]

    async def test_empty_stream_ends(self, nats_server):
        async with shadow_stream(nats_server.urls):
            pass
        source = JetStreamSource(nats_server.urls, "SHADOW", TAP, "none", stop_at_end=True)
        async with reading(source) as deliveries, asyncio.timeout(20):
            assert [d async for d in deliveries] == []

    async def test_held_acknowledgements(self, nats_server):
        """A reader that keeps every acknowledgement until its output is written
        (shadow-trace) may do so, and acknowledging later acknowledges them."""
        async with shadow_stream(nats_server.urls) as js:
            await publish_records(js, 4)
        source = JetStreamSource(nats_server.urls, "SHADOW", TAP, "held", stop_at_end=True)
        async with reading(source) as deliveries, asyncio.timeout(20):
            held = [d.ack async for d in deliveries]
            assert len(held) == 4
            for ack in held:
                await ack()
        async with shadow_stream_more(nats_server.urls) as js:

            async def acknowledged() -> bool:
                info = await js.consumer_info("SHADOW", "held")
                return info.num_ack_pending == 0 and info.delivered.stream_seq == 4

            await wait_until(acknowledged, timeout=10)


@contextlib.asynccontextmanager
async def shadow_stream_more(urls: list[str]) -> AsyncIterator[nats.js.JetStreamContext]:
    """A JetStream context on the SHADOW stream that already exists."""
    nc = await nats.connect(urls)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


class TestRefused:
    """A stream that is not there, or a durable that reads other subjects."""

    async def test_no_stream(self, nats_server):
        source = JetStreamSource(nats_server.urls, "NOPE", TAP, "d")
        with pytest.raises(SourceError, match="no JetStream stream 'NOPE' at nats://"):
            await source.open()

    async def test_no_stream_yet_is_waited_for(self, nats_server):
        lines: list[str] = []
        source = JetStreamSource(
            nats_server.urls, "LATER", TAP, "d", wait_for_stream=True, log=lines.append
        )
        opening = asyncio.create_task(source.open())
        try:
            await wait_until(lambda: lines, timeout=30, what="the waiting line")
            asked = messages_in(nats_server)
            await wait_until(
                lambda: messages_in(nats_server) > asked, timeout=30, what="a second look"
            )
            assert not opening.done() and len(lines) == 1, lines
            nc = await nats.connect(nats_server.urls)
            try:
                await nc.jetstream().add_stream(name="LATER", subjects=["shadow.>"])
            finally:
                await nc.close()
            await asyncio.wait_for(opening, 5)
        finally:
            opening.cancel()
            await source.aclose()
        assert lines == [
            f"no JetStream stream 'LATER' at {nats_server.urls[0]} yet: "
            "waiting for a proxy to create it"
        ]

    async def test_nothing_on_the_subject_names_what_the_stream_holds(self, nats_server):
        async with shadow_stream(nats_server.urls) as js:
            await js.publish(
                "shadow.custom-topic",
                synthetic_payload(TAP, 0),
                headers={"Shadow-Tap": TAP, "Shadow-Publisher-Id": "1"},
            )
        lines: list[str] = []
        source = JetStreamSource(nats_server.urls, "SHADOW", TAP, "hint", log=lines.append)
        async with reading(source) as deliveries:
            reading_started = time.monotonic()
            waiting = asyncio.ensure_future(anext(deliveries))
            try:
                await wait_until(lambda: lines, timeout=30, what="the hint")
                quiet_for = time.monotonic() - reading_started
                assert not waiting.done(), "nothing is delivered"
            finally:
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
        assert quiet_for >= HINT_AFTER_S
        assert lines == [
            f"nothing on {SUBJECT} in 5 s; stream 'SHADOW' holds "
            "shadow.custom-topic: for a tap with its own topic pass --topic TOPIC"
        ]

    async def test_durable_of_another_tap(self, nats_server):
        async with shadow_stream(nats_server.urls) as js:
            await js.add_consumer(
                "SHADOW",
                api.ConsumerConfig(
                    durable_name="shared",
                    filter_subject="shadow.other",
                    ack_policy=api.AckPolicy.EXPLICIT,
                ),
            )
        source = JetStreamSource(nats_server.urls, "SHADOW", TAP, "shared")
        with pytest.raises(SourceError, match="choose another --durable for this tap"):
            await source.open()

    def test_subject_and_description(self):
        assert default_subject("kv") == "shadow.shadow-requests-kv"
        assert default_subject("kv", "custom") == "shadow.custom"
        source = JetStreamSource(["nats://a:1", "nats://b:2"], "S", "kv", "d", subject="x.y")
        assert source.filter_subjects == ["x.y", "x.y.heartbeat"]
        assert source.describe() == "stream S subject x.y durable d at nats://a:1,nats://b:2"
