"""``shadow-trace``: what it reads and counts, its arguments and exit status, and
the ``analyze`` command's JSON, table and plot."""

from __future__ import annotations

import json

import pytest

from shadow_proxy.trace.cli import main
from tests.support.trace_records import envelope, export_rows, write_records


class TestReading:
    """Records are read once, counted by what became of them, and said on stderr."""

    def test_dedup_across_files_and_token_less_records(self, tmp_path, capsys):
        envelopes = [
            envelope(0, [1, 2]),
            envelope(1, None),
            envelope(2, []),
            envelope(0, [1, 2], tap="other"),
        ]
        code, rows = export_rows(tmp_path, envelopes, "--format", "mooncake", files=2)
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
        _, rows = export_rows(tmp_path, envelopes, "--format", "mooncake", "--tap", "other")
        assert len(rows) == 1

    def test_unreadable_and_invalid_records_are_counted(self, tmp_path, capsys):
        bad_tokens = envelope(1, [1])
        bad_tokens["request"]["token_ids"] = [-5]
        code, rows = export_rows(
            tmp_path, [b"\xc1", bad_tokens, envelope(2, [3])], "--format", "mooncake"
        )
        assert code == 0 and len(rows) == 1
        err = capsys.readouterr().err
        assert "1 invalid (bad_token_ids) skipped" in err and "1 unreadable skipped" in err

    def test_empty_source(self, tmp_path, capsys):
        """No records: one line and exit 2, no trace written."""
        path = write_records(tmp_path / "r.bin", [])
        out = tmp_path / "trace.jsonl"
        assert main(["export", str(path), "--format", "dynamo", "-o", str(out)]) == 2
        assert "shadow-trace: no records in the source: no trace written" in (
            capsys.readouterr().err
        )
        assert not out.exists()

    def test_no_token_ids(self, tmp_path, capsys):
        path = write_records(tmp_path / "r.bin", [envelope(0, None)])
        out = tmp_path / "trace.jsonl"
        assert main(["export", str(path), "--format", "mooncake", "-o", str(out)]) == 2
        assert "no request with token ids in the source" in capsys.readouterr().err

    def test_closed_stdout(self, tmp_path):
        """``export -o - | head``: no "[Errno 32] Broken pipe", exit 0."""
        import subprocess
        import sys

        path = write_records(tmp_path / "r.bin", [envelope(i, [i + 1] * 50) for i in range(3000)])
        script = "from shadow_proxy.trace.cli import main; raise SystemExit(main())"
        head = subprocess.Popen(
            ["head", "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
        )
        done = subprocess.run(
            [sys.executable, "-c", script, "export", str(path), "--format", "mooncake", "-o", "-"],
            stdout=head.stdin,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
        head.stdin.close()
        head.wait(30)
        assert done.returncode == 0, done.stderr
        assert b"Broken pipe" not in done.stderr and b"Traceback" not in done.stderr

    def test_max_records(self, tmp_path, capsys):
        envelopes = [envelope(i, [i + 1]) for i in range(5)]
        code, rows = export_rows(tmp_path, envelopes, "--format", "mooncake", "--max-records", "2")
        assert code == 0 and len(rows) == 2
        assert "2 records, 2 used" in capsys.readouterr().err

    def test_output_to_stdout(self, tmp_path, capsys):
        path = write_records(tmp_path / "r.bin", [envelope(0, [1, 2])])
        assert main(["export", str(path), "--format", "mooncake", "-o", "-"]) == 0
        out = capsys.readouterr()
        assert [json.loads(line)["input_length"] for line in out.out.splitlines()] == [2]
        assert "to stdout" in out.err


class TestArguments:
    """Bad arguments exit 2 naming what was wrong."""

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
    """``analyze``: the reuse report as JSON, a table on stdout and a PNG."""

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
        """No records: one line and exit 2 (it printed a table with "hit inf")."""
        path = write_records(tmp_path / "r.bin", [])
        assert main(["analyze", str(path), "--json", str(tmp_path / "j")]) == 2
        out = capsys.readouterr()
        assert "shadow-trace: no records in the source: nothing to analyze" in out.err
        assert "inf" not in out.out and not (tmp_path / "j").exists()


class TestCapacity:
    """``analyze --capacity N``: the one predicted hit rate of an N-block cache."""

    def test_predicted_line_and_json(self, tmp_path, capsys):
        # Two requests sharing their first two 2-token blocks; the second hits 4 of 6 tokens.
        records = [envelope(0, [1, 2, 3, 4, 5]), envelope(1, [1, 2, 3, 4, 9, 9])]
        source = write_records(tmp_path / "r.bin", records)
        out_json = tmp_path / "r.json"
        args = ["analyze", str(source), "--block-size", "2", "--capacity", "2"]
        assert main([*args, "--json", str(out_json)]) == 0
        line = "predicted hit rate with 2 blocks of 2 tokens (LRU): 36.4% of 11 prompt tokens"
        assert line in capsys.readouterr().out
        (predicted,) = json.loads(out_json.read_text())["predicted"]
        assert predicted["hit_rate"] == pytest.approx(4 / 11)
        assert main([*args[:-1], "1"]) == 0
        # touched leaf first, the first block stays: 2 of 11 tokens
        assert "with 1 blocks of 2 tokens (LRU): 18.2%" in capsys.readouterr().out

    def test_bad_capacity(self, tmp_path, capsys):
        source = write_records(tmp_path / "r.bin", [envelope(0, [1, 2])])
        with pytest.raises(SystemExit) as exit_info:
            main(["analyze", str(source), "--capacity", "0"])
        assert exit_info.value.code == 2
        assert "'--capacity' must be a positive number of blocks" in capsys.readouterr().err
