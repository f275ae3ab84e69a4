"""Reading for shadow-trace: requests kept, or streamed to a sink (none kept)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

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


class LosesACancel:
    """A live source that waits for records and, like Python 3.11's
    ``asyncio.wait_for`` when its call completes as the cancellation comes,
    drops the first cancellation."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.cancels = 0

    def __aiter__(self) -> LosesACancel:
        return self

    async def __anext__(self) -> Any:
        while True:
            self.waiting.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancels += 1
                if self.cancels > 1:
                    raise


async def test_a_signal_stops_a_read_that_drops_a_cancellation() -> None:
    source = LosesACancel()
    reading = asyncio.create_task(
        collect(source, Selection(), max_records=None, duration_s=None)  # type: ignore[arg-type]
    )
    await asyncio.wait_for(source.waiting.wait(), 10)
    os.kill(os.getpid(), signal.SIGTERM)  # collect's handler (the main thread's loop)
    requests, acks = await asyncio.wait_for(reading, 10)
    assert (requests, acks, source.cancels) == ([], [], 2)
