"""The worker process's loop parts: a failing message, the publishing of tap queues."""

from __future__ import annotations


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
