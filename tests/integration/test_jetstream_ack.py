"""A reader's acknowledgement is confirmed by the server (``Retrier.confirmed_ack``),
against a real nats-server: JetStream answers a ``+ACK`` sent as a request, and
an acknowledgement without an answer is sent again. A plain publish, lost in a
failover, left the record to come again after ``ack_wait`` (77 of 120 were, on a
leader kill)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import api

from shadow_proxy.records.jetstream_retry import ACK, ACK_RESENDS, Retrier

pytestmark = [pytest.mark.nats, pytest.mark.timeout(60)]


async def test_jetstream_confirms_an_ack(nats_server) -> None:
    nc = await nats.connect(nats_server.urls)
    try:
        js = nc.jetstream()
        await js.add_stream(name="ACKS", subjects=["acks.>"])
        await js.publish("acks.one", b"record")
        sub = await js.pull_subscribe(
            "acks.>", durable="reader", config=api.ConsumerConfig(ack_wait=30)
        )
        (msg,) = await sub.fetch(1, timeout=5)
        retrier = Retrier("stream 'ACKS'", None)
        await retrier.confirmed_ack(nc, msg.reply)()
        info = await sub.consumer_info()
        assert retrier.retries < ACK_RESENDS  # answered (a stalled machine may resend)
        assert info.num_ack_pending == 0 and info.ack_floor.stream_seq == 1
    finally:
        await nc.close()


async def test_an_unanswered_ack_is_sent_again(nats_server) -> None:
    """The reply subject's listener drops the first acknowledgement and answers
    every one after it: the reader waits for an answer, sending it again (once on
    a quiet machine; more if one stalls past the wait)."""
    nc = await nats.connect(nats_server.urls)
    got: list[bytes] = []

    async def listener(msg: Msg) -> None:
        got.append(msg.data)
        if len(got) >= 2:
            await msg.respond(b"")

    try:
        await nc.subscribe("acks.reply", cb=listener)
        await nc.flush()
        retrier = Retrier("stream 'ACKS'", None)
        await asyncio.wait_for(retrier.confirmed_ack(nc, "acks.reply")(), 20)
        assert len(got) >= 2 and set(got) == {ACK}
        assert retrier.retries >= 1
    finally:
        await nc.close()
