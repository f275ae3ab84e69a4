"""The trace exporters (through ``shadow-trace export``): each format's fields, the
order of the rows, block ids (the command's own rules: test_cli.py)."""

from __future__ import annotations

from shadow_proxy.trace.blocks import dynamo_sequence_hashes
from tests.support.trace_records import T0, envelope, export_rows


class TestMooncake:
    def test_fields(self, tmp_path):
        code, rows = export_rows(
            tmp_path,
            [
                envelope(0, [1, 2, 3], arrival_ms=5.9, max_tokens=7),
                envelope(1, [1, 2, 3, 4, 5], arrival_ms=1012.2, output_tokens=9, session_id="s1"),
            ],
            "--format",
            "mooncake",
            "--block-size",
            "2",
            "--session-id",
        )
        assert code == 0
        assert rows == [
            {"timestamp": 0, "input_length": 3, "output_length": 7, "hash_ids": [0, 1]},
            {
                "timestamp": 1006,
                "input_length": 5,
                "output_length": 9,
                "hash_ids": [0, 2, 3],
                "session_id": "s1",
            },
        ]

    def test_ordered_by_arrival_and_ids_by_first_appearance(self, tmp_path):
        _, rows = export_rows(
            tmp_path,
            [envelope(0, [7, 7], arrival_ms=50), envelope(1, [5, 5], arrival_ms=10)],
            "--format",
            "mooncake",
            "--block-size",
            "2",
        )
        assert [(r["timestamp"], r["hash_ids"]) for r in rows] == [(0, [0]), (40, [1])]

    def test_default_block_size_512(self, tmp_path):
        _, rows = export_rows(tmp_path, [envelope(0, range(1025))], "--format", "mooncake")
        assert rows[0]["hash_ids"] == [0, 1, 2]

    def test_no_session_id_by_default(self, tmp_path):
        """Rows carry the whole prompt, which AIPerf replays as it is; with a
        session_id AIPerf takes it for a turn's new input (and its completions
        endpoint refuses a second turn)."""
        records = [envelope(0, [1], session_id="s")]
        for flags in ((), ("--no-session-id",)):
            _, rows = export_rows(tmp_path, records, "--format", "mooncake", *flags)
            assert "session_id" not in rows[0]
        _, rows = export_rows(tmp_path, records, "--format", "mooncake", "--session-id")
        assert rows[0]["session_id"] == "s"

    def test_request_record_without_max_tokens(self, tmp_path):
        _, rows = export_rows(tmp_path, [envelope(0, [1], max_tokens=None)], "--format", "mooncake")
        assert "output_length" not in rows[0]


class TestDynamo:
    def test_fields(self, tmp_path):
        tokens = list(range(150))
        code, rows = export_rows(
            tmp_path,
            [
                envelope(0, tokens, arrival_ms=3.7, output_tokens=12, end_ms=250.4),
                envelope(1, tokens[:10], arrival_ms=9.0),
            ],
            "--format",
            "dynamo",
        )
        assert code == 0
        received = (T0 + 3_700_000) // 1_000_000
        assert rows[0] == {
            "timestamp": 250,
            "event": {
                "schema": "dynamo.request.trace.v1",
                "event_type": "request_end",
                "event_time_unix_ms": received + 250,
                "request": {
                    "request_id": "req-kv-0",
                    "input_tokens": 150,
                    "output_tokens": 12,
                    "request_received_ms": received,
                    "ttft_ms": 20.5,
                    "total_time_ms": 250.4,
                    "replay": {
                        "trace_block_size": 64,
                        "input_length": 150,
                        "input_sequence_hashes": dynamo_sequence_hashes(tokens, 64),
                    },
                },
            },
        }
        assert list(rows[0]["event"]) == ["schema", "event_type", "event_time_unix_ms", "request"]
        second = rows[1]["event"]["request"]
        assert "output_tokens" not in second and "total_time_ms" not in second  # request record
        assert rows[1]["event"]["event_time_unix_ms"] == second["request_received_ms"]
        assert rows[1]["timestamp"] == 6  # ms: 9 - 3 (arrivals floored to ms)

    def test_block_size(self, tmp_path):
        _, rows = export_rows(
            tmp_path, [envelope(0, range(10))], "--format", "dynamo", "--block-size", "4"
        )
        replay = rows[0]["event"]["request"]["replay"]
        assert replay["input_sequence_hashes"] == dynamo_sequence_hashes(range(10), 4)
