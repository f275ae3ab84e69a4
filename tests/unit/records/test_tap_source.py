"""A live tap on a real SUB socket: exact topics, dedup, heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import zmq

from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records import sources, wire
from tests.support.record_sources import TOPIC, heartbeat, payload, record
from tests.support.tap_messages import publisher


def send(socket: zmq.Socket, message: wire.Message) -> None:
    socket.send_multipart(
        wire.encode_frames(
            message.topic, message.publisher_id, message.sequence, 0, message.payload
        )
    )


@contextlib.asynccontextmanager
async def reading(source: sources.TapSource) -> AsyncIterator[list[sources.Delivery]]:
    """Deliveries collected by a task while the block runs."""
    found: list[sources.Delivery] = []

    async def read() -> None:
        async for delivery in source:
            found.append(delivery)

    task = asyncio.create_task(read())
    try:
        yield found
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await source.aclose()


class TestTapSource:
    """A live tap on a real SUB socket: exact topics, dedup, heartbeats."""

    async def test_records_and_heartbeats(self) -> None:
        with publisher() as (socket, endpoint):
            source = sources.TapSource([endpoint], TOPIC, heartbeats=True)
            assert source.live and source.describe() == f"topic {TOPIC} at {endpoint}"
            async with reading(source) as found:
                # The first sends may go before the subscription arrives (slow
                # joiner): repeat seq 0 until it comes; the repeats are duplicates.
                await wait_until(lambda: send(socket, record(0)) or found, 10)
                send(socket, wire.Message(TOPIC + "-sibling", 1, 0, 0, payload(9)))
                send(socket, heartbeat(next_seq=2))
                send(socket, record(1))
                await wait_until(lambda: len(found) >= 3, 10)
            kinds = [
                ("beat", d.heartbeat.next_seq) if d.heartbeat else ("rec", d.envelope["seq"])
                for d in found
            ]
            assert kinds == [("rec", 0), ("beat", 2), ("rec", 1)]  # repeats of seq 0: once
            assert found[0].where == endpoint
            assert source.stats.unreadable.get("topic") == 1  # the sibling: prefix match only
            assert source.stats.records == 2

    async def test_aclose_is_idempotent(self) -> None:
        source = sources.TapSource(["tcp://127.0.0.1:1"], TOPIC)
        await source.aclose()
        await source.aclose()
