"""Trace exporters: Mooncake / AIPerf ``mooncake_trace`` rows and Dynamo request-trace rows.

Pure (writes to a text stream it is given). ``Exporter.add`` runs once per selected
request, in any order; ``Exporter.write`` then writes one JSON line per request,
ordered by arrival (ties keep the order the requests came in). Per request only
what the row needs is kept (Mooncake: 16 bytes per block; Dynamo: 8), never the
token ids.

Mooncake row (what AIPerf 0.13's ``MooncakeTrace`` model reads): ``timestamp``
(integer ms since the first request's arrival), ``input_length``,
``output_length`` (when known), ``hash_ids`` (see ``blocks.MooncakeIds``; AIPerf
rebuilds block ``i`` as ``block_size`` tokens and the last one as the remainder, so
``--isl-block-size`` must equal the export's block size), ``session_id`` (when the
request carries one and sessions are kept).

Dynamo line: as Dynamo 1.6.1's ``jsonl`` request-trace sink writes it (observed
with ``DYN_REQUEST_TRACE=1``): ``{"timestamp": ms, "event": ROW}``, where our
``timestamp`` counts from the first request's arrival (Dynamo's from its sink's
start) and ROW is ``dynamo.request.trace.v1`` / ``request_end`` with the fields,
in Dynamo's order, that a record can fill: ``event_time_unix_ms`` (arrival plus
the response's duration when joined), ``request``: ``request_id`` (the proxy's,
not Dynamo's), ``input_tokens``, ``output_tokens``, ``request_received_ms``,
``ttft_ms`` and ``total_time_ms`` (joined records; measured at the proxy), and
``replay``: ``trace_block_size``, ``input_length``, ``input_sequence_hashes``.
Dynamo-only fields (``cached_tokens``, ``prefill_*``, ``avg_itl_ms``, ``worker``)
are left out.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import attrs

from shadow_proxy.trace.blocks import (
    MooncakeIds,
    block_fingerprints,
    check_block_size,
    dynamo_sequence_hashes,
)
from shadow_proxy.trace.selection import TraceRequest

FORMATS = ("mooncake", "dynamo")
DEFAULT_BLOCK_SIZE = {"mooncake": 512, "dynamo": 64}
DYNAMO_SCHEMA = "dynamo.request.trace.v1"


class ExportError(ValueError):
    """A format or block size the exporter does not take."""


def check_format(name: str) -> str:
    if name not in FORMATS:
        msg = f"'--format' must be one of {', '.join(FORMATS)} (got {name!r})"
        raise ExportError(msg)
    return name


@attrs.frozen
class _Pending:
    arrival_unix_ns: int
    order: int
    input_length: int
    output_length: int | None
    session_id: str | None
    request_id: str
    end_offset_ns: int | None
    joined: bool
    first_token_offset_ns: int | None
    blocks: Any  # mooncake: (lane1, lane2); dynamo: list of hashes


@attrs.define
class Exporter:
    """Collects requests, then writes them as one trace."""

    format: str = attrs.field(converter=check_format)
    block_size: int | None = None
    sessions: bool = True
    _pending: list[_Pending] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        if self.block_size is None:
            self.block_size = DEFAULT_BLOCK_SIZE[self.format]
        try:
            check_block_size(self.block_size)
        except ValueError as exc:
            msg = f"'--block-size' must be a positive integer (got {self.block_size!r})"
            raise ExportError(msg) from exc

    def add(self, request: TraceRequest) -> None:
        assert self.block_size is not None
        if self.format == "mooncake":
            blocks: Any = block_fingerprints(request.token_ids, self.block_size, partial=True)
        else:
            blocks = dynamo_sequence_hashes(request.token_ids, self.block_size)
        self._pending.append(
            _Pending(
                arrival_unix_ns=request.arrival_unix_ns,
                order=len(self._pending),
                input_length=request.input_length,
                output_length=request.output_length,
                session_id=request.session_id if self.sessions else None,
                request_id=request.request_id,
                end_offset_ns=request.end_offset_ns,
                joined=request.joined,
                first_token_offset_ns=request.first_token_offset_ns,
                blocks=blocks,
            )
        )

    def __len__(self) -> int:
        return len(self._pending)

    def rows(self) -> list[dict[str, Any]]:
        """The trace rows, ordered by arrival."""
        pending = sorted(self._pending, key=lambda p: (p.arrival_unix_ns, p.order))
        if self.format == "mooncake":
            return self._mooncake_rows(pending)
        first = pending[0].arrival_unix_ns // 1_000_000 if pending else 0
        return [self._dynamo_line(p, first) for p in pending]

    def write(self, out: TextIO) -> int:
        """Write the rows as JSON lines; returns how many."""
        rows = self.rows()
        for row in rows:
            out.write(json.dumps(row, separators=(",", ":")))
            out.write("\n")
        return len(rows)

    def _mooncake_rows(self, pending: list[_Pending]) -> list[dict[str, Any]]:
        assert self.block_size is not None
        ids = MooncakeIds(self.block_size)
        first = pending[0].arrival_unix_ns if pending else 0
        rows = []
        for p in pending:
            lane1, lane2 = p.blocks
            row: dict[str, Any] = {
                "timestamp": (p.arrival_unix_ns - first) // 1_000_000,
                "input_length": p.input_length,
            }
            if p.output_length is not None:
                row["output_length"] = p.output_length
            row["hash_ids"] = ids.number(lane1, lane2)
            if p.session_id is not None:
                row["session_id"] = p.session_id
            rows.append(row)
        return rows

    def _dynamo_line(self, p: _Pending, first_ms: int) -> dict[str, Any]:
        received_ms = p.arrival_unix_ns // 1_000_000
        event_ms = received_ms
        request: dict[str, Any] = {"request_id": p.request_id, "input_tokens": p.input_length}
        if p.joined and p.output_length is not None:
            request["output_tokens"] = p.output_length
        request["request_received_ms"] = received_ms
        if p.joined and p.first_token_offset_ns is not None:
            request["ttft_ms"] = p.first_token_offset_ns / 1e6
        if p.joined and p.end_offset_ns is not None:
            request["total_time_ms"] = p.end_offset_ns / 1e6
            event_ms += round(p.end_offset_ns / 1e6)
        request["replay"] = {
            "trace_block_size": self.block_size,
            "input_length": p.input_length,
            "input_sequence_hashes": p.blocks,
        }
        event = {
            "schema": DYNAMO_SCHEMA,
            "event_type": "request_end",
            "event_time_unix_ms": event_ms,
            "request": request,
        }
        return {"timestamp": event_ms - first_ms, "event": event}
