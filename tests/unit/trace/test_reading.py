"""Reading for shadow-trace: requests kept, or streamed to a sink (none kept)."""

from __future__ import annotations

from shadow_proxy.records.sources import FileSource
from shadow_proxy.trace.reading import collect
from shadow_proxy.trace.selection import Selection
from tests.support.trace_records import envelope, write_records


async def test_kept_or_sunk(tmp_path) -> None:
    path = write_records(tmp_path / "r.bin", [envelope(k, [k, 1]) for k in range(5)])
    requests, acks = await collect(
        FileSource([path]), Selection(), max_records=None, duration_s=None
    )
    assert [r.request_id for r in requests] == [f"req-kv-{k}" for k in range(5)] and acks == []
    sunk: list[int] = []
    requests, _ = await collect(
        FileSource([path]),
        Selection(),
        max_records=3,
        duration_s=None,
        sink=lambda request, record: sunk.append(record["seq"]),
    )
    assert requests == [] and sunk == [0, 1, 2]
