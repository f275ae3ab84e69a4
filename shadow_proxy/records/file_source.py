"""Records from files (``records/files.py``: paths, rotated directories, globs),
and the reorder window that puts a file's records back in arrival order."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from shadow_proxy.records import files, wire
from shadow_proxy.records.delivery import Delivery, RecordSource

#: File sources give the event loop a turn every this many entries.
YIELD_EVERY = 256


class FileSource(RecordSource):
    """Record files, in the order ``files.expand`` gives."""

    def __init__(self, paths: Sequence[Path], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.paths = list(paths)
        #: The files' sizes when opened, and about how much of them was read
        #: (``progress``: a progress line's total and ETA).
        self.total_bytes = sum(p.stat().st_size for p in self.paths if p.is_file())
        self.read_bytes = 0

    def describe(self) -> str:
        return f"{len(self.paths)} record file(s)"

    def progress(self) -> tuple[int, int]:
        """(bytes read, bytes in all), the first counted by payload within a file."""
        return self.read_bytes, self.total_bytes

    async def deliveries(self) -> AsyncIterator[Delivery]:
        count = 0
        done = 0
        for path in self.paths:
            self.stats.files += 1
            for entry in files.read_entries(path):
                count += 1
                if count % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                self.read_bytes += (
                    entry.skipped_bytes
                    if isinstance(entry, files.Unreadable)
                    else len(entry.payload) + files.LENGTH.size
                )
                if isinstance(entry, files.Unreadable):
                    self.stats.reject(entry.reason, entry.skipped_bytes)
                    continue
                if entry.topic.endswith(wire.HEARTBEAT_SUFFIX):
                    delivery = self._heartbeat(entry, str(path))
                else:
                    delivery = self._record(entry, str(path))
                if delivery is not None:
                    yield delivery
            with contextlib.suppress(OSError):
                done += path.stat().st_size
            self.read_bytes = done


#: Records a reorder window holds by default (about 1 KiB of state each, plus
#: the records themselves).
DEFAULT_REORDER_WINDOW = 4096


async def in_arrival_order(
    deliveries: AsyncIterator[Delivery], window: int = DEFAULT_REORDER_WINDOW
) -> AsyncIterator[Delivery]:
    """Deliveries re-sorted by ``arrival_unix_ns`` within a bounded window.

    Joined records are published when their response ends, so a record file
    is in end order, not arrival order. Holding up to ``window`` deliveries in
    a heap restores arrival order wherever a record is overtaken by fewer than
    ``window`` later-arriving ones (at most ``window`` are held at any time).
    """
    heap: list[tuple[int, int, Delivery]] = []
    count = 0
    async for delivery in deliveries:
        count += 1
        arrival = delivery.envelope["arrival_unix_ns"] if delivery.envelope is not None else 0
        heapq.heappush(heap, (arrival, count, delivery))
        if len(heap) > window:
            yield heapq.heappop(heap)[2]
    while heap:
        yield heapq.heappop(heap)[2]
