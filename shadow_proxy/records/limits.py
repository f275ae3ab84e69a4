"""How much of a source a tool reads: ``--max-records N`` and ``--duration S``.

``Limited`` wraps any async iterable of deliveries (a record source, or what a
tool made of one) and ends it after ``max_records`` items or ``duration_s``
seconds from the first ``__anext__``, whichever comes first; ``stopped_by``
then says which (``max_records``, ``duration``), or stays None when the source
itself ended. The duration is kept even while the source yields nothing (a
quiet live tap): the wait for the next item is bounded by what is left of it.
Leaving ends the wrapped iterator (``aclose``), so a source closes its sockets.

``reading_progress`` is the part of a progress line that says how far through
its record files a tool is, and when it will be done.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_RECORDS = "max_records"
DURATION = "duration"


class Limited(Generic[T]):
    """The items of ``items`` up to a count and a time; iterate once."""

    def __init__(
        self,
        items: AsyncIterable[T],
        *,
        max_records: int | None = None,
        duration_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_records is not None and max_records < 1:
            msg = f"'max_records' must be at least 1 (got {max_records})"
            raise ValueError(msg)
        if duration_s is not None and not duration_s > 0:
            msg = f"'duration_s' must be above 0 (got {duration_s})"
            raise ValueError(msg)
        self.items = items
        self.max_records = max_records
        self.duration_s = duration_s
        self.clock = clock
        self.taken = 0
        #: Why the iteration ended early, or None (the source ended).
        self.stopped_by: str | None = None

    def __aiter__(self) -> AsyncIterator[T]:
        return self._run()

    async def _run(self) -> AsyncIterator[T]:
        iterator = aiter(self.items)
        deadline = None if self.duration_s is None else self.clock() + self.duration_s
        try:
            while self.max_records is None or self.taken < self.max_records:
                if deadline is None:
                    item = await anext(iterator, _END)
                else:
                    left = deadline - self.clock()
                    if left <= 0:
                        self.stopped_by = DURATION
                        return
                    try:
                        item = await asyncio.wait_for(anext(iterator, _END), left)
                    except TimeoutError:
                        self.stopped_by = DURATION
                        return
                if item is _END:
                    return
                self.taken += 1
                yield item  # type: ignore[misc]
            self.stopped_by = MAX_RECORDS
        finally:
            closer = getattr(iterator, "aclose", None)
            if closer is not None:
                with contextlib.suppress(RuntimeError):  # a generator cancelled mid-await
                    await closer()


_END = object()


def reading_progress(done_bytes: int, total_bytes: int, elapsed_s: float) -> str:
    """``45% of 12.3 MB read, ETA 0:32`` (the ETA from the rate so far)."""
    if total_bytes <= 0:
        return "0 B to read"
    share = min(done_bytes / total_bytes, 1.0)
    text = f"{share:.0%} of {_size(total_bytes)} read"
    if 0 < share < 1 and elapsed_s > 0:
        left = int(elapsed_s * (1 - share) / share)
        text += f", ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}"
    return text


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
