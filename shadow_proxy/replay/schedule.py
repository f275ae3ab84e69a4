"""When each record is sent (SPEC section 11, "Schedule").

One reader task takes items from the source and puts them, with the time
they are due, on a bounded ``asyncio.Queue``; ``concurrency`` sender tasks take
them off and send them. ``Scheduler.run`` returns when the source is exhausted
and every item taken was sent or skipped; a source that fails ends it the same
way, then its exception is raised; cancelling it (Ctrl-C) cancels the reader
and the senders, and what was counted so far stands.

Due times (monotonic):

- a file source (``live`` False) at a finite ``speed``: the first record is due
  when the reader reads it; record k at that time plus (its
  ``arrival_unix_ns`` minus the first record's) / ``speed``; the reader sleeps
  until an item is due before queueing it;
- ``speed`` None (``--speed max``): nothing is due; senders take items as fast
  as they can, the queue keeps them busy, nothing is ever late;
- a live source: due when the reader received it.

An item taken by a sender more than ``max_lag_s`` after it was due is not sent:
``late(item)`` counts it (awaited when it returns an awaitable). A source
faster than the senders fills the queue, the reader then waits on ``put`` and
the source's own bounded buffer holds the rest (a ZeroMQ tap drops past its
high-water mark and says so in its heartbeat).

Memory bound: at most ``queue_size`` (default 2 x ``concurrency``) items in the
queue, ``concurrency`` in the senders and one in the reader, whatever the
source's rate.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Generic, TypeVar

import attrs

T = TypeVar("T")


@attrs.frozen
class ScheduleConfig:
    """How records are paced."""

    concurrency: int = attrs.field()
    #: Divides recorded inter-arrival times; None: as fast as possible.
    speed: float | None = None
    max_lag_s: float = 5.0
    live: bool = False
    #: The queue between reader and senders; 0 means 2 x concurrency.
    queue_size: int = 0

    @concurrency.validator
    def _check_concurrency(self, _attribute: attrs.Attribute, value: int) -> None:
        if value < 1:
            msg = f"'concurrency' must be at least 1 (got {value})"
            raise ValueError(msg)

    def __attrs_post_init__(self) -> None:
        if self.speed is not None and not self.speed > 0:
            msg = f"'speed' must be above 0 or max (got {self.speed})"
            raise ValueError(msg)
        if self.max_lag_s < 0:
            msg = f"'max_lag_s' must be at least 0 (got {self.max_lag_s})"
            raise ValueError(msg)
        if self.queue_size < 0:
            msg = f"'queue_size' must be at least 0 (got {self.queue_size})"
            raise ValueError(msg)

    @property
    def bound(self) -> int:
        return self.queue_size or 2 * self.concurrency


@attrs.define
class ScheduleCounts:
    """What the scheduler did so far (read by the progress line)."""

    read: int = 0
    sent: int = 0
    late: int = 0
    in_flight: int = 0
    #: Highest queue depth seen (at most ``ScheduleConfig.bound``).
    max_depth: int = 0


class Scheduler(Generic[T]):
    """Paces items from a source to ``send``; ``late`` gets those past the lag."""

    def __init__(
        self,
        config: ScheduleConfig,
        send: Callable[[T], Awaitable[None]],
        late: Callable[[T], Awaitable[None] | None],
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.config = config
        self.counts = ScheduleCounts()
        self._send = send
        self._late = late
        self._clock = clock
        self._queue: asyncio.Queue[tuple[T, int | None] | None] = asyncio.Queue(config.bound)

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    async def run(self, items: AsyncIterable[tuple[T, int | None]]) -> None:
        """Send every item (``(item, arrival_unix_ns)``) or count it late."""
        senders = [
            asyncio.create_task(self._sender(), name=f"replay-sender-{k}")
            for k in range(self.config.concurrency)
        ]
        try:
            failure: Exception | None = None
            try:
                await self._read(items)
            except Exception as exc:  # the source failed: what was taken is still sent
                failure = exc
            for _ in senders:
                await self._queue.put(None)
            await asyncio.gather(*senders)
            if failure is not None:
                raise failure
        finally:
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)

    async def _read(self, items: AsyncIterable[tuple[T, int | None]]) -> None:
        config = self.config
        origin: tuple[int, int] | None = None  # (first arrival ns, its due time)
        async for item, arrival in items:
            self.counts.read += 1
            now = self._clock()
            due: int | None
            if config.live:
                due = now
            elif config.speed is None:
                due = None
            elif arrival is None:
                due = now
            else:
                if origin is None:
                    origin = (arrival, now)
                due = origin[1] + int((arrival - origin[0]) / config.speed)
                if due > now:
                    await asyncio.sleep((due - now) / 1e9)
            await self._queue.put((item, due))
            self.counts.max_depth = max(self.counts.max_depth, self._queue.qsize())

    async def _sender(self) -> None:
        limit = int(self.config.max_lag_s * 1e9)
        while True:
            entry = await self._queue.get()
            if entry is None:  # the end
                return
            item, due = entry
            if due is not None and self._clock() - due > limit:
                self.counts.late += 1
                counted = self._late(item)
                if inspect.isawaitable(counted):
                    await counted
                continue
            self.counts.in_flight += 1
            try:
                await self._send(item)
            finally:
                self.counts.in_flight -= 1
                self.counts.sent += 1
