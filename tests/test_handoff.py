"""The hand-off's byte bound: never more than ``max_bytes`` unread by the worker."""

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


class TestWorkerFailures:
    """A message the worker cannot process is dropped, counted and logged without its text."""

    def test_malformed_message_counted_not_fatal(self, tmp_path, caplog):
        from shadow_proxy.config import Config
        from shadow_proxy.worker.joiner import Joiner
        from shadow_proxy.worker.main import handle_safely

        config = Config.from_mapping(
            {
                "schema_version": 1,
                "upstream": {"url": "http://127.0.0.1:1"},
                "taps": [{"name": "t", "capture": "request", "endpoint": f"ipc://{tmp_path}/t"}],
            }
        )
        joiner = Joiner(config, {})
        secret = b"sk-secret-in-a-body"
        handle_safely(joiner, [b"q" + b"\0" * 8 + b"short-meta", secret])
        failures = joiner.metrics.registry.get_sample_value(
            "shadow_worker_failures_total", {"exception": "struct.error"}
        )
        assert failures == 1
        assert "hand-off message dropped: struct.error at" in caplog.text
        assert "sk-secret" not in caplog.text
        assert "unpack requires" not in caplog.text, "the exception's message is logged"
