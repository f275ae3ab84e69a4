"""The worker process's loop parts: a failing message, the publishing of tap queues."""

from __future__ import annotations

import zmq

from shadow_proxy.records import wire
from shadow_proxy.worker.joiner import Joiner
from shadow_proxy.worker.main import Publishing
from tests.support.servers import proxy_config


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


def joiner_with_taps(*names: str) -> Joiner:
    taps = [{"name": n, "capture": "request", "endpoint": f"inproc://{n}"} for n in names]
    return Joiner(proxy_config("http://127.0.0.1:9", taps=taps), {})


class TestPublishing:
    """Each tap's queue goes out on its own socket; the listing shows every counter."""

    def test_listing(self) -> None:
        context = zmq.Context()
        joiner = joiner_with_taps("kv", "replay")
        publishing = Publishing(joiner, context)
        try:
            joiner.taps[0].queue.take_seq()
            joiner.taps[0].queue.offer(b"x")
            kv, replay = publishing.listing()
            assert set(kv) == {
                "name", "topic", "endpoint", "capture", "filters", "models", "sample",
                "capacity", "publisher_id", "next_seq", "queued", "published", "dropped",
                "skipped", "publish_errors", "queue_depth", "transport", "curve",
            }  # fmt: skip
            assert (kv["name"], kv["endpoint"], kv["next_seq"], kv["queue_depth"]) == (
                "kv", "inproc://kv", 1, 1,
            )  # fmt: skip
            assert kv["publisher_id"] != replay["publisher_id"]
            assert kv["transport"] == "zmq"
            assert replay["next_seq"] == 0
        finally:
            publishing.close()
            context.term()

    def test_pump_and_drain(self) -> None:
        context = zmq.Context()
        joiner = joiner_with_taps("kv")
        publishing = Publishing(joiner, context)
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"shadow-requests-kv")
        sub.connect("inproc://kv")
        [publisher] = publishing.publishers
        try:
            assert publisher.socket.poll(5000), "no subscription"
            queue = joiner.taps[0].queue
            for payload in (b"a", b"b"):
                queue.offer(payload)
            assert publishing.pump() is False
            queue.offer(b"c")
            assert publishing.drain(2.0) == 0  # everything published in time
            got = []
            while sub.poll(1000):
                got.append(wire.decode_frames(sub.recv_multipart()).payload)
            assert got == [b"a", b"b", b"c"]
            assert queue.closed and not queue.offer(b"d")
            assert queue.dropped["closed"] == 1
        finally:
            sub.close(linger=0)
            publishing.close()
            context.term()
