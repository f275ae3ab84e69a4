"""``shadow-trace export --format parquet``: one typed row per record, read back
as an analyst would (DuckDB, pyarrow), row groups bounding memory."""

from __future__ import annotations

import duckdb
import pyarrow.parquet as pq
import pytest

from shadow_proxy.trace import parquet
from shadow_proxy.trace.cli import main
from tests.support.trace_records import T0, envelope, write_records

RECORDS = 50


def capture() -> list[dict]:
    envelopes = []
    for k in range(RECORDS):
        record = envelope(
            k,
            list(range(k, k + 10 + k % 7)),
            arrival_ms=k * 10,
            output_tokens=5 if k % 2 else None,
            end_ms=40.0 + k,
            session_id="s1" if k % 3 == 0 else None,
        )
        record["request"]["sampling_options"] = {"temperature": 0.5, "top_k": -1, "seed": k}
        if record.get("response") is not None:
            record["response"]["last_token_offset_ns"] = int(60e6)
            record["response"]["choices"] = [{"index": 0, "finish_reason": "length"}]
            record["response"]["usage"] = {"prompt_tokens_details": {"cached_tokens": 4}}
        envelopes.append(record)
    return envelopes


def test_duckdb_reads_the_rows_and_token_ids(tmp_path, capsys) -> None:
    envelopes = capture()
    source = write_records(tmp_path / "capture.bin", envelopes)
    out = tmp_path / "capture.parquet"
    assert main(["export", str(source), "--format", "parquet", "-o", str(out)]) == 0
    assert "wrote 50 rows in 1 row groups" in capsys.readouterr().err
    db = duckdb.connect()
    (count,) = db.execute(f"select count(*) from '{out}'").fetchone()
    assert count == RECORDS
    rows = db.execute(f"select seq, token_ids from '{out}' order by seq").fetchall()
    assert rows == [(e["seq"], e["request"]["token_ids"]) for e in envelopes]
    # The README's query: TTFT by prompt length.
    by_length = db.execute(
        f"select prompt_tokens // 8 * 8 as bucket, avg(ttft_ms) from '{out}' "
        "where ttft_ms is not null group by bucket order by bucket"
    ).fetchall()
    assert by_length and all(ttft == pytest.approx(20.5) for _, ttft in by_length)


def test_typed_columns(tmp_path) -> None:
    source = write_records(tmp_path / "capture.bin", capture())
    out = tmp_path / "capture.parquet"
    assert main(["export", str(source), "--format", "parquet", "-o", str(out)]) == 0
    table = pq.read_table(out)
    assert table.schema == parquet.SCHEMA
    rows = {row["seq"]: row for row in table.to_pylist()}
    joined = rows[1]
    assert (joined["outcome"], joined["finish_reason"], joined["output_tokens"]) == (
        "complete",
        "length",
        5,
    )
    assert joined["e2e_ms"] == pytest.approx(41.0) and joined["cached_tokens"] == 4
    assert joined["itl_ms"] == pytest.approx((60 - 20.5) / 4)
    assert table.column("arrival").cast("int64")[1].as_py() == T0 + 10_000_000
    request_only = rows[0]
    assert request_only["outcome"] is None and request_only["session_id"] == "s1"
    assert request_only["max_tokens"] == 16 and request_only["seed"] == 0
    assert request_only["temperature"] == 0.5 and request_only["top_k"] == -1


def test_row_groups_bound_memory(tmp_path) -> None:
    """At most ``row_group_rows`` rows (or so many tokens) are held at once."""
    from shadow_proxy.trace.selection import Selection

    export = parquet.ParquetExport(tmp_path / "x.parquet", row_group_rows=8, row_group_tokens=40)
    selection = Selection()
    for record in capture():
        request = selection.take(record, 7)
        assert request is not None
        export.add(request, record)
        assert len(export._pending) < 8 and export._tokens < 40
    assert export.close() == RECORDS
    metadata = pq.ParquetFile(tmp_path / "x.parquet").metadata
    assert metadata.num_rows == RECORDS and metadata.num_row_groups == export.row_groups > 12


def test_stdout_refused_and_nothing_left(tmp_path, capsys) -> None:
    source = write_records(tmp_path / "capture.bin", capture())
    assert main(["export", str(source), "--format", "parquet", "-o", "-"]) == 2
    assert "writes a file" in capsys.readouterr().err
    empty = write_records(tmp_path / "empty.bin", [])
    out = tmp_path / "e.parquet"
    assert main(["export", str(empty), "--format", "parquet", "-o", str(out)]) == 2
    assert not out.exists() and list(tmp_path.glob(".*partial")) == []


def test_columns_documented() -> None:
    table = parquet.columns_table()
    assert all(f"| `{name}` |" in table for name, _, _ in parquet.COLUMNS)
