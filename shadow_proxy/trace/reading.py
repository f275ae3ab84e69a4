"""Reading a source for ``shadow-trace``: every trace request, with the
acknowledgements to give once the output is written, and a progress line."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from shadow_proxy.records import sources
from shadow_proxy.records.limits import Limited, reading_progress

if TYPE_CHECKING:  # numpy: imported once the tools extra was found (extras.missing_tools)
    from shadow_proxy.trace.selection import Selection, TraceRequest

PROGRESS_AFTER_S = 3.0
#: Where a request goes as it is read, with its record (a streaming export).
Sink = Callable[["TraceRequest", Mapping[str, Any]], None]


def _note(line: str) -> None:
    print(f"shadow-trace: {line}", file=sys.stderr, flush=True)


class _Progress:
    """``records N, used M, R/s`` (and for files, how far and an ETA) on stderr,
    redrawn at most once a second."""

    def __init__(self, stream: TextIO, source: sources.RecordSource) -> None:
        self.stream = stream
        self.source = source
        self.enabled = stream.isatty()
        self.start = time.monotonic()
        self.shown = False
        self.next = self.start + PROGRESS_AFTER_S

    def tick(self, selection: Selection) -> None:
        now = time.monotonic()
        if not self.enabled or now < self.next:
            return
        self.next = now + 1.0
        elapsed = now - self.start
        rate = selection.records / elapsed
        where = ""
        if isinstance(self.source, sources.FileSource):
            where = ", " + reading_progress(*self.source.progress(), elapsed)
        self.stream.write(
            f"\rshadow-trace: {selection.records:,} records, {selection.kept:,} used, "
            f"{rate:,.0f} records/s{where} "
        )
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\n")


Ack = Callable[[], Awaitable[None]]


async def collect(
    source: sources.RecordSource,
    selection: Selection,
    *,
    max_records: int | None,
    duration_s: float | None,
    sink: Sink | None = None,
) -> tuple[list[TraceRequest], list[Ack]]:
    """Every trace request the source holds, and the acknowledgements to give
    once the output is written. Reading ends with the source, ``--max-records``,
    ``--duration``, or SIGINT/SIGTERM (what was read is kept). Exports and the
    reuse analysis order by arrival, so they need all of them; memory is about
    4 bytes per prompt token (an acknowledgement holds no record)."""
    progress = _Progress(sys.stderr, source)
    requests: list[TraceRequest] = []
    acks: list[Ack] = []

    async def read() -> None:
        limited = Limited(source, max_records=max_records, duration_s=duration_s)
        async for delivery in limited:
            publisher = delivery.message.publisher_id or None  # 0: a file without ids
            request = selection.take(delivery.envelope, publisher)
            if request is not None and sink is not None:
                assert delivery.envelope is not None
                sink(request, delivery.envelope)
            elif request is not None:
                requests.append(request)
            if delivery.acknowledgement is not None:
                acks.append(delivery.acknowledgement)
            if selection.records % 1024 == 0:
                progress.tick(selection)

    reading = asyncio.create_task(read())
    loop = asyncio.get_running_loop()
    # A live source read until Ctrl-C: stop reading, keep what was read (signal
    # handlers are the main thread's; run elsewhere, as a library, there are none).
    main = threading.current_thread() is threading.main_thread()
    signals = (signal.SIGINT, signal.SIGTERM) if main else ()
    stopped = asyncio.Event()
    for sig in signals:
        loop.add_signal_handler(sig, stopped.set)
    try:
        await until_read_or_stopped(reading, stopped)
        if reading.cancelled():
            _note("stopped by a signal: using what was read")
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        progress.done()
    return requests, acks


#: How often a reading told to stop is cancelled again until it ends.
RECANCEL_S = 0.5


async def until_read_or_stopped(reading: asyncio.Task[None], stopped: asyncio.Event) -> None:
    """Wait for ``reading`` to end (its error raised here); once ``stopped`` is
    set, cancel it until it ends. One cancel is not enough: Python 3.11's
    ``asyncio.wait_for`` (nats-py's fetch) drops a cancellation that arrives as
    the call it waits for completes, and a live source then reads on for ever
    (a test under load waited 60 s for a SIGTERM to end the read)."""
    stop = asyncio.create_task(stopped.wait())
    try:
        await asyncio.wait({reading, stop}, return_when=asyncio.FIRST_COMPLETED)
        while not reading.done():
            reading.cancel()
            await asyncio.wait({reading}, timeout=RECANCEL_S)
    except asyncio.CancelledError:  # the caller's own cancellation: the reading ends too
        reading.cancel()
        raise
    finally:
        stop.cancel()
    if not reading.cancelled():
        reading.result()
