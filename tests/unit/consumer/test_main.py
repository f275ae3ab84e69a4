"""The consumer's runner on a real SUB socket, in this process."""

from __future__ import annotations

import json
import os
import threading

from shadow_proxy.consumer import main as consumer
from shadow_proxy.records import files, wire
from tests.support.tap_messages import TOPIC, publish_until, publisher


class TestRunner:
    """The runner on a real SUB socket, stopping by itself or on SIGTERM."""

    def test_max_records_summary_and_record_file(self, tmp_path):
        summary_path = tmp_path / "summary.json"
        record_path = tmp_path / "records.bin"
        with publisher() as (sock, endpoint):
            argv = [
                "--endpoint",
                endpoint,
                "--topic",
                TOPIC,
                "--max-records",
                "5",
                "--interval",
                "0.05",
                "--summary-path",
                str(summary_path),
                "--record",
                str(record_path),
                "--duration",
                "20",
            ]
            result: list[int] = []
            out = open(os.devnull, "w")  # noqa: SIM115
            thread = threading.Thread(
                target=lambda: result.append(consumer.run_consumer(argv, out=out, err=out))
            )
            thread.start()
            publish_until(sock, lambda: not thread.is_alive())
            thread.join(5)
            out.close()
        assert result == [0]
        summary = json.loads(summary_path.read_text())
        assert summary["records"] == 5
        assert summary["prompt_tokens"] == 10
        assert summary["tap_gaps"] == summary["transport_gaps"] == 0
        assert summary["endpoints"] == [endpoint]
        assert [p["records"] for p in summary["publishers"]] == [5]
        assert summary["undecodable"].get("topic", 0) >= 1  # the sibling topic, rejected
        raw = files.read_payloads(record_path)
        assert len(raw) == 5
        assert wire.decode_envelope(raw[0])["tap"] == "a"
        assert not list(tmp_path.glob(".*.tmp"))
