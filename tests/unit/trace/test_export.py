"""Exporters and the shadow-trace command: fields, order, dedup, bad input."""

from __future__ import annotations

import json

import pytest

from shadow_proxy.trace.blocks import dynamo_sequence_hashes
from shadow_proxy.trace.cli import main
from tests.support.trace_records import T0, envelope, write_records


def export(tmp_path, envelopes, *args, files=1):
    sources = []
    for i in range(files):
        sources.append(str(write_records(tmp_path / f"rec{i}.bin", envelopes)))
    out = tmp_path / "trace.jsonl"
    code = main(["export", *sources, "-o", str(out), *args])
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return code, rows


class TestMooncake:
    def test_fields(self, tmp_path):
        code, rows = export(
            tmp_path,
            [
                envelope(0, [1, 2, 3], arrival_ms=5.9, max_tokens=7),
                envelope(1, [1, 2, 3, 4, 5], arrival_ms=1012.2, output_tokens=9, session_id="s1"),
            ],
            "--format",
            "mooncake",
            "--block-size",
            "2",
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
        _, rows = export(
            tmp_path,
            [envelope(0, [7, 7], arrival_ms=50), envelope(1, [5, 5], arrival_ms=10)],
            "--format",
            "mooncake",
            "--block-size",
            "2",
        )
        assert [(r["timestamp"], r["hash_ids"]) for r in rows] == [(0, [0]), (40, [1])]

    def test_default_block_size_512(self, tmp_path):
        _, rows = export(tmp_path, [envelope(0, range(1025))], "--format", "mooncake")
        assert rows[0]["hash_ids"] == [0, 1, 2]

    def test_no_session_id(self, tmp_path):
        _, rows = export(
            tmp_path, [envelope(0, [1], session_id="s")], "--format", "mooncake", "--no-session-id"
        )
        assert "session_id" not in rows[0]

    def test_request_record_without_max_tokens(self, tmp_path):
        _, rows = export(tmp_path, [envelope(0, [1], max_tokens=None)], "--format", "mooncake")
        assert "output_length" not in rows[0]


class TestDynamo:
    def test_fields(self, tmp_path):
        tokens = list(range(150))
        code, rows = export(
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
        _, rows = export(
            tmp_path, [envelope(0, range(10))], "--format", "dynamo", "--block-size", "4"
        )
        replay = rows[0]["event"]["request"]["replay"]
        assert replay["input_sequence_hashes"] == dynamo_sequence_hashes(range(10), 4)


class TestBadInput:
    def test_dedup_across_files_and_token_less_records(self, tmp_path, capsys):
        envelopes = [
            envelope(0, [1, 2]),
            envelope(1, None),
            envelope(2, []),
            envelope(0, [1, 2], tap="other"),
        ]
        code, rows = export(tmp_path, envelopes, "--format", "mooncake", files=2)
        assert code == 0 and len(rows) == 2  # (kv, 0) and (other, 0), each once
        err = capsys.readouterr().err
        assert "8 records, 2 used, 4 duplicates skipped, 2 without token ids skipped" in err

    def test_two_proxies_with_the_same_tap_and_seq_both_count(self, tmp_path):
        a = write_records(tmp_path / "a.bin", [envelope(0, [1, 2])], publisher_id=1)
        b = write_records(tmp_path / "b.bin", [envelope(0, [1, 2])], publisher_id=2)
        out = tmp_path / "trace.jsonl"
        assert main(["export", str(a), str(b), "--format", "mooncake", "-o", str(out)]) == 0
        assert len(out.read_text().splitlines()) == 2

    def test_tap_filter(self, tmp_path):
        envelopes = [envelope(0, [1]), envelope(0, [2], tap="other")]
        _, rows = export(tmp_path, envelopes, "--format", "mooncake", "--tap", "other")
        assert len(rows) == 1

    def test_unreadable_and_invalid_records_are_counted(self, tmp_path, capsys):
        bad_tokens = envelope(1, [1])
        bad_tokens["request"]["token_ids"] = [-5]
        code, rows = export(
            tmp_path, [b"\xc1", bad_tokens, envelope(2, [3])], "--format", "mooncake"
        )
        assert code == 0 and len(rows) == 1
        err = capsys.readouterr().err
        assert "1 invalid (bad_token_ids) skipped" in err and "1 unreadable skipped" in err

    def test_empty_source(self, tmp_path, capsys):
        code, rows = export(tmp_path, [], "--format", "dynamo")
        assert code == 0 and rows == [] and (tmp_path / "trace.jsonl").read_text() == ""
        assert "the trace is empty" in capsys.readouterr().err

    def test_unknown_format_lists_valid_ones(self, tmp_path, capsys):
        path = write_records(tmp_path / "r.bin", [envelope(0, [1])])
        with pytest.raises(SystemExit) as exit_info:
            main(["export", str(path), "--format", "sharegpt", "-o", str(tmp_path / "o")])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "'sharegpt'" in err and "mooncake" in err and "dynamo" in err

    @pytest.mark.parametrize("size", ["0", "-3", "x"])
    def test_bad_block_size(self, tmp_path, capsys, size):
        path = write_records(tmp_path / "r.bin", [envelope(0, [1])])
        with pytest.raises(SystemExit) as exit_info:
            main(["export", str(path), "--format", "mooncake", "--block-size", size, "-o", "o"])
        assert exit_info.value.code == 2
        assert (
            f"'--block-size' must be a positive integer (got '{size}')" in capsys.readouterr().err
        )

    def test_bad_block_size_list(self, tmp_path, capsys):
        path = write_records(tmp_path / "r.bin", [envelope(0, [1])])
        with pytest.raises(SystemExit):
            main(["analyze", str(path), "--block-size", "16,0"])
        assert "positive integers separated by commas (got '0')" in capsys.readouterr().err

    def test_missing_source(self, tmp_path, capsys):
        code = main(["export", str(tmp_path / "nope*"), "--format", "mooncake", "-o", "o"])
        assert code == 2 and "no record files in" in capsys.readouterr().err


class TestAnalyze:
    def test_json_table_and_plot(self, tmp_path, capsys):
        prompts = [list(range(64)), list(range(64)), list(range(32)) + [999] * 32]
        path = write_records(
            tmp_path / "r.bin", [envelope(i, p, arrival_ms=i) for i, p in enumerate(prompts)]
        )
        out_json, out_png = tmp_path / "reuse.json", tmp_path / "reuse.png"
        code = main(
            [
                "analyze",
                str(path),
                "--block-size",
                "16,64",
                "--json",
                str(out_json),
                "--plot",
                str(out_png),
            ]
        )
        assert code == 0
        doc = json.loads(out_json.read_text())
        assert doc["command"].startswith("shadow-trace analyze ")
        assert doc["block_sizes"] == [16, 64]
        assert doc["input"]["used"] == 3
        b16 = doc["all"]["16"]
        assert (b16["requests"], b16["prompt_tokens"]) == (3, 192)
        assert b16["hit_rate_infinite"] == (64 + 32) / 192
        assert doc["all"]["64"]["hit_rate_infinite"] == 64 / 192
        assert doc["models"]["m"] == doc["all"]
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        table = capsys.readouterr().out
        assert "(all)" in table and "50.0%" in table

    def test_empty_source(self, tmp_path, capsys):
        path = write_records(tmp_path / "r.bin", [])
        assert main(["analyze", str(path), "--json", str(tmp_path / "j")]) == 0
        assert "nothing to analyze" in capsys.readouterr().err
        assert json.loads((tmp_path / "j").read_text())["all"]["64"]["requests"] == 0
