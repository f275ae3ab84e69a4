"""Reading a source for ``shadow-trace``: every trace request it holds, with a
progress line on stderr, stopped by SIGINT/SIGTERM with what was read kept, and
JetStream acknowledgements given only once the output is written."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TextIO

from shadow_proxy.records import sources
from shadow_proxy.records.limits import Limited, reading_progress

if TYPE_CHECKING:
    from shadow_proxy.trace.selection import Selection, TraceRequest

PROGRESS_AFTER_S = 3.0


class Progress:
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
) -> tuple[list[TraceRequest], list[Ack]]:
    """Every trace request the source holds, and the acknowledgements to give
    once the output is written. Reading ends with the source, ``--max-records``,
    ``--duration``, or SIGINT/SIGTERM (what was read is kept). Exports and the
    reuse analysis order by arrival, so they need all of them; memory is about
    4 bytes per prompt token (an acknowledgement holds no record)."""
    progress = Progress(sys.stderr, source)
    requests: list[TraceRequest] = []
    acks: list[Ack] = []

    async def read() -> None:
        limited = Limited(source, max_records=max_records, duration_s=duration_s)
        async for delivery in limited:
            publisher = delivery.message.publisher_id or None  # 0: a file without ids
            request = selection.take(delivery.envelope, publisher)
            if request is not None:
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
    for sig in signals:
        loop.add_signal_handler(sig, reading.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        if reading.cancelled():
            note("stopped by a signal: using what was read")
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        progress.done()
    return requests, acks


def note(line: str) -> None:
    print(f"shadow-trace: {line}", file=sys.stderr, flush=True)


def run(
    args: argparse.Namespace, selection: Selection, produce: Callable[[list[TraceRequest]], int]
) -> int:
    """Read the source, then ``produce`` the output from what was read (it returns
    an exit status); JetStream records are acknowledged once it returned 0."""

    async def main() -> int:
        # Selection deduplicates (also records of files without publisher ids).
        source = sources.open_source(args, dedup=False, log=note)
        try:
            await source.open()
            requests, acks = await collect(
                source, selection, max_records=args.max_records, duration_s=args.duration
            )
            args.unreadable = sum(source.stats.unreadable.values())
            code = produce(requests)
            if code == 0:
                for ack in acks:  # the output is written: these are handled
                    await ack()
            return code
        finally:
            await source.aclose()

    return asyncio.run(main())


def nothing_to_do(selection: Selection, unreadable: int) -> str | None:
    """Why there is nothing to export or analyse (say it, exit 2), or None."""
    if selection.records == 0:
        extra = f" ({unreadable:,} unreadable entries)" if unreadable else ""
        return f"no records in the source{extra}"
    if selection.kept == 0:
        return "no request with token ids in the source (see above)"
    return None


def summary_line(selection: Selection, unreadable: int) -> str:
    s = selection.summary()
    parts = [f"{s['records']:,} records", f"{s['used']:,} used"]
    if s["duplicates"]:
        parts.append(f"{s['duplicates']:,} duplicates skipped")
    if s["without_token_ids"]:
        parts.append(f"{s['without_token_ids']:,} without token ids skipped")
    if s.get("other_tap"):
        parts.append(f"{s['other_tap']:,} of other taps skipped")
    for reason, n in s["invalid"].items():
        parts.append(f"{n:,} invalid ({reason}) skipped")
    if unreadable:
        parts.append(f"{unreadable:,} unreadable skipped")
    return "shadow-trace: " + ", ".join(parts)
