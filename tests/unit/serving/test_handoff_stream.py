"""The hand-off on its Unix socket: bounded in bytes, one write per loop iteration,
and a dead worker's requests accounted for at the next connection."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import CollectorRegistry

from shadow_proxy.channel import checkpoint as cp
from shadow_proxy.channel.handoff import End, Hello, Request
from shadow_proxy.devtools.processes import wait_until as wait_for
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.serving.handoff import Handoff
from shadow_proxy.serving.metrics import ProxyMetrics
from tests.support.handoff import HandoffReader as Worker


@pytest.fixture
async def handoff(tmp_path):
    registry = CollectorRegistry()
    handoff = Handoff(str(tmp_path / "h"), 100_000, ProxyMetrics.create(registry))
    handoff.registry = registry
    await handoff.start()
    yield handoff
    handoff.close()
    await wait_for(lambda: handoff._transport is None or handoff._transport.is_closing())
    await asyncio.sleep(0.05)  # the transport closes after its buffer is written


def dropped(handoff, reason: str) -> float:
    return handoff.registry.get_sample_value("shadow_handoff_dropped_total", {"reason": reason})


async def connected(handoff: Handoff, path) -> Worker:
    worker = Worker(str(path))
    await wait_for(lambda: handoff.worker_alive)
    await wait_for(lambda: worker.read())
    return worker


def hello_of(message: object) -> Hello:
    assert isinstance(message, Hello)
    return message


class TestConnection:
    """A hello first; sends while no worker is connected are counted as worker_dead."""

    async def test_hello_then_messages(self, handoff, tmp_path):
        assert handoff.open(Route.CHAT, "r0", b"{}", 1, 2) is None
        assert dropped(handoff, "worker_dead") == 1
        worker = await connected(handoff, tmp_path / "h")
        assert hello_of(worker.messages[0]) == Hello(0, 0, ())
        capture = handoff.open(Route.CHAT, "r1", b'{"a":1}', 3, 4)
        capture.end(EndKind.CLEAN)
        await wait_for(lambda: len(worker.read()) == 3)
        q, e = worker.messages[1:]
        assert isinstance(q, Request) and (q.request_id, q.body) == ("r1", b'{"a":1}')
        assert isinstance(e, End)
        worker.close()


class TestBatching:
    """Every message of one loop iteration leaves in one write."""

    async def test_one_flush_per_iteration(self, handoff, tmp_path):
        worker = await connected(handoff, tmp_path / "h")
        before = handoff.flushes
        for i in range(10):
            handoff.open(Route.CHAT, f"r{i}", b"x" * 100, 1, 1).end(EndKind.CLEAN)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert handoff.flushes == before + 1
        for i in range(5):
            handoff.open(Route.CHAT, f"s{i}", b"x", 1, 1)
        await wait_for(lambda: len(worker.read()) == 1 + 20 + 5)
        assert handoff.flushes == before + 2
        worker.close()


class TestByteBound:
    """A worker that does not read costs at most max_bytes in the serving process;
    what does not fit is dropped whole and counted, and the worker learns how many."""

    async def test_bound_then_lost_before(self, handoff, tmp_path):
        worker = await connected(handoff, tmp_path / "h")
        handoff._transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
        )
        worker.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = b"y" * 10_000
        accepted = 0
        for _ in range(60):
            accepted += handoff.open(Route.CHAT, "r", body, 1, 1) is not None
            await asyncio.sleep(0)  # let each iteration flush
            assert handoff._transport.get_write_buffer_size() <= handoff.max_bytes
        full = dropped(handoff, "full")
        assert full > 0 and accepted + full == 60
        assert accepted * 10_000 < 100_000 + 64_000  # the bound plus the kernel's buffers
        await wait_for(lambda: len(worker.read()) == 1 + accepted)
        handoff.open(Route.CHAT, "after", b"{}", 1, 1)
        await wait_for(lambda: len(worker.read()) == 2 + accepted)
        last = worker.messages[-1]
        assert isinstance(last, Request)
        assert last.lost_before == full  # each tap counts them (handoff_full)
        worker.close()


class TestDeadWorker:
    """The next worker's hello carries the dead one's final state per tap."""

    async def test_final_states_in_the_next_hello(self, handoff, tmp_path):
        finals_seen = []
        handoff.on_final_states = lambda generation, finals: finals_seen.append(
            (generation, finals)
        )
        handoff.generation = 1
        worker = await connected(handoff, tmp_path / "h")
        for i in range(5):
            handoff.open(Route.CHAT, f"r{i}", b"{}", 1, 1)
        await wait_for(lambda: len(worker.read()) == 6)
        worker.close()  # killed: 5 requests handed over, the checkpoint says 2 resolved
        await wait_for(lambda: not handoff.worker_alive)
        for i in range(3):  # while no worker is there
            assert handoff.open(Route.CHAT, f"d{i}", b"{}", 1, 1) is None
        state = cp.TapState(
            name="kv",
            publisher_id=9,
            next_seq=2,
            resolved=2,
            published=1,
            queued=2,
            next_transport=1,
        )
        handoff.worker_died(cp.Checkpoint(1, 0, (state,)))
        handoff.generation = 2
        worker = await connected(handoff, tmp_path / "h")
        hello = hello_of(worker.messages[0])
        assert hello.generation == 2
        (final,) = hello.tombstones
        # 1 record unsent, 3 requests unresolved, 3 arrived while dead.
        assert final.dropped == {"worker_died": 1 + 3 + 3}
        assert final.next_seq == 2 + 3 + 3
        assert finals_seen == [(1, (final,))]
        worker.close()

    async def test_checkpoint_of_another_generation_is_ignored(self, handoff, tmp_path, caplog):
        handoff.generation = 1
        worker = await connected(handoff, tmp_path / "h")
        handoff.open(Route.CHAT, "r", b"{}", 1, 1)
        await wait_for(lambda: len(worker.read()) == 2)
        worker.close()
        await wait_for(lambda: not handoff.worker_alive)
        stale = cp.Checkpoint(0, 0, (cp.TapState(name="kv", publisher_id=1),))
        handoff.worker_died(stale)
        worker = await connected(handoff, tmp_path / "h")
        assert hello_of(worker.messages[0]).tombstones == ()
        assert "left no checkpoint" in caplog.text
        worker.close()
