"""The hand-off's sending end: the byte bound, restarts, and what each message carries."""

from __future__ import annotations

import zmq
from prometheus_client import CollectorRegistry

from shadow_proxy.exchange import Route
from shadow_proxy.serving.handoff import Handoff
from shadow_proxy.serving.metrics import ProxyMetrics


class TestByteBound:
    """A stalled worker costs at most max_bytes; drops are counted as full."""

    def test_bytes_in_flight_bounded_then_credit_restores(self, tmp_path):
        context = zmq.Context()
        registry = CollectorRegistry()
        metrics = ProxyMetrics.create(registry)
        handoff = Handoff(context, f"ipc://{tmp_path}/h", 1000, 100_000, metrics)
        pull = context.socket(zmq.PULL)
        pull.connect(handoff.endpoint)
        try:
            assert handoff._socket.poll(5000, zmq.POLLOUT), "the worker end never connected"
            body = b"x" * 10_000
            sent = [handoff.open(Route.CHAT, "r", body, 1, 1) for _ in range(20)]
            assert sum(c is not None for c in sent) == 9  # 9 x ~10 KB fit in 100 KB
            dropped = registry.get_sample_value("shadow_handoff_dropped_total", {"reason": "full"})
            assert dropped == 11
            received = 0
            for _ in range(9):
                received += sum(len(f) for f in pull.recv_multipart())
            handoff.acked_bytes = received  # what the worker reports as read
            assert handoff.open(Route.CHAT, "r", body, 1, 1) is not None
        finally:
            pull.close(linger=0)
            handoff.close()
            context.term()

    def test_restart_forgets_the_old_worker(self, tmp_path):
        context = zmq.Context()
        metrics = ProxyMetrics.create(CollectorRegistry())
        handoff = Handoff(context, f"ipc://{tmp_path}/h", 1000, 50, metrics)
        try:
            assert handoff.open(Route.CHAT, "r", b"y" * 100, 1, 1) is None
            assert handoff._lost_requests == 1
            handoff.restarted()
            assert handoff._lost_requests == 0
        finally:
            handoff.close()
            context.term()
