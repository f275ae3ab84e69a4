"""The pool's records of its shards: how many by default, output written without
blocking and in order, the pool's metrics."""

from __future__ import annotations

import os
import socket

from prometheus_client import CollectorRegistry

from shadow_proxy.channel.stream import StreamDecoder, stream_message
from shadow_proxy.worker.main.shards import PoolMetrics, Shard, default_processes, write_out


class TestProcesses:
    def test_one_per_core_given(self) -> None:
        assert default_processes() == min(len(os.sched_getaffinity(0)), default_processes())
        assert default_processes() >= 1

    def test_follows_the_affinity(self) -> None:
        before = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {min(before)})
            assert default_processes() == 1
        finally:
            os.sched_setaffinity(0, before)


class TestWriteOut:
    """What the pipe does not take stays queued, in order, never half a message."""

    def test_partial_writes_keep_order(self) -> None:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        shard = Shard(0, 1, process=None, started=0.0, sock=ours)  # type: ignore[arg-type]
        messages = [stream_message([b"q", bytes([i]) * 30_000]) for i in range(8)]
        for m in messages:
            shard.queue(m)
        decoder = StreamDecoder()
        got: list[bytes] = []
        theirs.settimeout(5)
        while len(got) < len(messages):
            write_out(shard)
            assert shard.out_bytes == sum(len(b) for b in shard.out)
            got += decoder.feed(theirs.recv(1 << 16))
        assert got == messages and shard.out == []
        ours.close()
        theirs.close()


def test_pool_metrics_exist_at_zero() -> None:
    registry = CollectorRegistry()
    PoolMetrics(registry)
    for reason in ("died", "recycled"):
        assert (
            registry.get_sample_value("shadow_worker_shard_restarts_total", {"reason": reason}) == 0
        )
    assert registry.get_sample_value("shadow_worker_processes") == 0
