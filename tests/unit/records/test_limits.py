"""``--max-records`` and ``--duration`` on any source, and the progress text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shadow_proxy.records.limits import Limited, reading_progress

pytestmark = pytest.mark.timeout(30)


class Source:
    """Yields ``count`` items, then waits for ever (a quiet live tap) unless it ends."""

    def __init__(self, count: int, *, ends: bool) -> None:
        self.count, self.ends, self.closed = count, ends, False

    async def items(self) -> AsyncIterator[int]:
        try:
            for k in range(self.count):
                yield k
            if not self.ends:
                await asyncio.Event().wait()
        finally:
            self.closed = True


class TestLimited:
    """Ends at the count, at the time (even while nothing comes), or with the source."""

    async def test_max_records(self) -> None:
        source = Source(10, ends=True)
        limited = Limited(source.items(), max_records=3)
        assert [k async for k in limited] == [0, 1, 2]
        assert limited.stopped_by == "max_records" and source.closed

    async def test_duration_while_quiet(self) -> None:
        source = Source(2, ends=False)
        limited = Limited(source.items(), duration_s=0.3)
        assert [k async for k in limited] == [0, 1]
        assert limited.stopped_by == "duration" and source.closed

    async def test_source_end(self) -> None:
        limited = Limited(Source(2, ends=True).items(), max_records=5, duration_s=30)
        assert [k async for k in limited] == [0, 1]
        assert limited.stopped_by is None

    def test_bad_limits(self) -> None:
        with pytest.raises(ValueError, match="'max_records' must be at least 1"):
            Limited(Source(0, ends=True).items(), max_records=0)
        with pytest.raises(ValueError, match="'duration_s' must be above 0"):
            Limited(Source(0, ends=True).items(), duration_s=0)


class TestProgress:
    def test_text(self) -> None:
        assert reading_progress(450, 1000, 9.0) == "45% of 1.0 kB read, ETA 0:00:11"
        assert reading_progress(0, 12_300_000, 1.0) == "0% of 12.3 MB read"
        assert reading_progress(5, 5, 1.0) == "100% of 5 B read"
