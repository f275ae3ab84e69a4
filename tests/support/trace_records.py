"""Records for the shadow-trace tests: envelopes as the worker builds them, and
record files as ``shadow-consumer --record`` writes them, and an export of them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from shadow_proxy.records import envelope as records
from shadow_proxy.records import wire
from shadow_proxy.records.files import RecordFile
from shadow_proxy.trace.cli import main

T0 = 1_700_000_000_000_000_000  # an arrival wall clock, ns


def envelope(
    seq: int,
    tokens: Sequence[int] | None,
    *,
    tap: str = "kv",
    arrival_ms: float = 0.0,
    model: str = "m",
    max_tokens: int | None = 16,
    output_tokens: int | None = None,
    end_ms: float | None = None,
    session_id: str | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """A record; joined (with a response) when ``output_tokens`` is given."""
    request: dict[str, Any] = {"model": model}
    if tokens is not None:
        request["token_ids"] = list(tokens)
    if max_tokens is not None:
        request["stop_conditions"] = {"max_tokens": max_tokens}
    if session_id is not None:
        request["agent_context"] = {"session_id": session_id}
    response = None
    if output_tokens is not None:
        response = {"outcome": "complete", "output_tokens": output_tokens, "choices": []}
        if end_ms is not None:
            response["end_offset_ns"] = int(end_ms * 1e6)
            response["first_token_offset_ns"] = int(min(end_ms, 20.5) * 1e6)
    return records.build_envelope(
        tap=tap,
        seq=seq,
        request_id=request_id or f"req-{tap}-{seq}",
        origin="completions",
        filters=[],
        arrival_unix_ns=T0 + int(arrival_ms * 1e6),
        sample_rate=1.0,
        request=request,
        response=response,
    )


def write_records(
    path: Path, envelopes: Iterable[dict[str, Any] | bytes], *, publisher_id: int = 7
) -> Path:
    """A record file holding ``envelopes`` as one publisher's messages (raw bytes
    entries are written as payloads as they are)."""
    out = RecordFile(path, max_bytes=1 << 40, keep=0)
    for i, item in enumerate(envelopes):
        payload = item if isinstance(item, bytes) else wire.encode_envelope(item)
        out.write(wire.Message("t", publisher_id, i, 0, payload))
    out.close()
    path.touch()
    return path


def export_rows(
    tmp_path: Path, envelopes: Sequence[dict[str, Any] | bytes], *args: str, files: int = 1
) -> tuple[int, list[dict[str, Any]]]:
    """``shadow-trace export`` of ``envelopes`` written to ``files`` record files
    (the same records in each); its exit status and the rows it wrote."""
    sources = [str(write_records(tmp_path / f"rec{i}.bin", envelopes)) for i in range(files)]
    out = tmp_path / "trace.jsonl"
    code = main(["export", *sources, "-o", str(out), *args])
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return code, rows
