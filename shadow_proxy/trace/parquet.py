"""``shadow-trace export --format parquet``: one row per record, typed columns,
for analysis in DuckDB, Polars or pandas (issue 31).

The rows are written as they are read, in row groups of at most
``ROW_GROUP_ROWS`` rows or ``ROW_GROUP_TOKENS`` prompt tokens, whichever comes
first: memory stays bounded by one row group, whatever the capture's size
(unlike the JSON-lines exports, which order by arrival, rows are in the order
the source gives: files' order, a stream's order). The file is written beside
its name and moved into place once complete. Records the trace selection skips
(no token ids, another tap, repeats) are skipped here too, and counted.

Columns (``COLUMNS``: name, type, meaning); a value the record does not have is
null: request-only records have no response columns, ``cached_tokens`` is the
frontend's ``usage.prompt_tokens_details.cached_tokens`` where it reported it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shadow_proxy.trace.selection import TraceRequest

ROW_GROUP_ROWS = 4096
ROW_GROUP_TOKENS = 8_000_000

#: (name, type, meaning): the file's schema and its documentation.
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("request_id", pa.string(), "the proxy's request id (a batch's prompts: one each)"),
    ("tap", pa.string(), "the tap that recorded it"),
    ("seq", pa.uint64(), "the record's seq in its tap (per proxy process)"),
    ("model", pa.string(), "the request's model"),
    ("origin", pa.string(), "chat, completions or other"),
    ("arrival", pa.timestamp("ns", tz="UTC"), "when the request arrived at the proxy"),
    ("session_id", pa.string(), "request.agent_context.session_id"),
    ("prompt_tokens", pa.uint32(), "the prompt's length in tokens"),
    ("token_ids", pa.list_(pa.uint32()), "the prompt's token ids"),
    ("max_tokens", pa.uint32(), "stop_conditions.max_tokens"),
    ("outcome", pa.string(), "complete, incomplete, cancelled or error (joined records)"),
    ("finish_reason", pa.string(), "the first choice's finish reason"),
    ("output_tokens", pa.uint32(), "tokens generated, all choices"),
    ("ttft_ms", pa.float64(), "arrival to the first output token, at the proxy"),
    ("itl_ms", pa.float64(), "mean time between output tokens (first to last)"),
    ("e2e_ms", pa.float64(), "arrival to the end of the response"),
    ("cached_tokens", pa.uint32(), "prompt tokens the engine had cached (usage)"),
    ("http_status", pa.uint16(), "the frontend's status"),
    ("temperature", pa.float64(), "sampling_options.temperature"),
    ("top_p", pa.float64(), "sampling_options.top_p"),
    ("top_k", pa.int32(), "sampling_options.top_k"),
    ("seed", pa.int64(), "sampling_options.seed"),
    ("n", pa.uint32(), "sampling_options.n"),
    ("sampling_options", pa.string(), "every sampling option, as JSON"),
)
SCHEMA = pa.schema([pa.field(name, kind) for name, kind, _ in COLUMNS])


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _ms(offset_ns: Any) -> float | None:
    count = _count(offset_ns)
    return None if count is None else count / 1e6


def row(request: TraceRequest, envelope: Mapping[str, Any]) -> dict[str, Any]:
    """The row of one selected record (``request``: what the selection made of it)."""
    body = _mapping(envelope.get("request"))
    response = envelope.get("response")
    answer = _mapping(response)
    sampling = _mapping(body.get("sampling_options"))
    choices = answer.get("choices")
    first_choice = _mapping(choices[0]) if isinstance(choices, list) and choices else {}
    output_tokens = _count(answer.get("output_tokens"))
    first, last = (_count(answer.get(k)) for k in ("first_token_offset_ns", "last_token_offset_ns"))
    itl = None
    if first is not None and last is not None and output_tokens and output_tokens > 1:
        itl = (last - first) / 1e6 / (output_tokens - 1)
    details = _mapping(_mapping(answer.get("usage")).get("prompt_tokens_details"))
    status = _count(answer.get("http_status"))
    n = _count(sampling.get("n"))
    return {
        "request_id": request.request_id,
        "tap": request.tap,
        "seq": _count(envelope.get("seq")),
        "model": request.model,
        "origin": _text(envelope.get("origin")),
        "arrival": request.arrival_unix_ns,
        "session_id": request.session_id,
        "prompt_tokens": request.input_length,
        "token_ids": request.token_ids,
        "max_tokens": _count(_mapping(body.get("stop_conditions")).get("max_tokens")),
        "outcome": _text(answer.get("outcome")),
        "finish_reason": _text(first_choice.get("finish_reason")),
        "output_tokens": output_tokens if isinstance(response, Mapping) else None,
        "ttft_ms": _ms(first),
        "itl_ms": itl,
        "e2e_ms": _ms(answer.get("end_offset_ns")),
        "cached_tokens": _count(details.get("cached_tokens")),
        "http_status": status if status is not None and status < 2**16 else None,
        "temperature": _number(sampling.get("temperature")),
        "top_p": _number(sampling.get("top_p")),
        "top_k": _integer(sampling.get("top_k")),
        "seed": _integer(sampling.get("seed")),
        "n": n if n is not None and n < 2**32 else None,
        "sampling_options": json.dumps(sampling, sort_keys=True, default=str) if sampling else None,
    }


class ParquetExport:
    """Rows added one by one, written a row group at a time."""

    def __init__(
        self,
        path: Path,
        *,
        row_group_rows: int = ROW_GROUP_ROWS,
        row_group_tokens: int = ROW_GROUP_TOKENS,
    ) -> None:
        self.path = path
        self.partial = path.with_name(f".{path.name}.partial")
        self.row_group_rows = row_group_rows
        self.row_group_tokens = row_group_tokens
        self.rows = 0
        self.row_groups = 0
        self._pending: list[dict[str, Any]] = []
        self._tokens = 0
        self._writer: pq.ParquetWriter | None = None

    def add(self, request: TraceRequest, envelope: Mapping[str, Any]) -> None:
        self._pending.append(row(request, envelope))
        self._tokens += request.input_length
        if len(self._pending) >= self.row_group_rows or self._tokens >= self.row_group_tokens:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        columns = {name: [r[name] for r in self._pending] for name, _, _ in COLUMNS}
        columns["token_ids"] = [ids.tolist() for ids in columns["token_ids"]]
        table = pa.Table.from_pydict(columns, schema=SCHEMA)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.partial, SCHEMA, compression="zstd")
        self._writer.write_table(table)
        self.rows += len(self._pending)
        self.row_groups += 1
        self._pending = []
        self._tokens = 0

    def close(self) -> int:
        """Write what is left and move the file into place; returns the rows written."""
        self._flush()
        if self._writer is None:  # nothing selected: an empty file with the schema
            self._writer = pq.ParquetWriter(self.partial, SCHEMA, compression="zstd")
        self._writer.close()
        self.partial.replace(self.path)
        return self.rows

    def abort(self) -> None:
        """Nothing to keep: close and remove the partial file."""
        if self._writer is not None:
            self._writer.close()
        self.partial.unlink(missing_ok=True)


def columns_table() -> str:
    """The columns as a Markdown table (docs/trace.md shows it)."""
    lines = ["| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | `{kind}` | {doc} |" for name, kind, doc in COLUMNS]
    return "\n".join(lines)
