"""``shadow-consumer``: read one tap's records from any source and keep totals.

Reads through the shared record source (``records/sources.py``): a live tap
(``--endpoint``/``--topic`` or ``--discover``/``--tap``), record files, or a
JetStream stream (``--nats``/``--stream``/``--tap``/``--durable``). Prints a
live line on stderr every interval, the JSON summary on stdout at the end
(Ctrl-C, SIGTERM, ``--duration``, ``--max-records``, or the end of the files),
and can keep the summary in a file (rewritten atomically every interval) and
the raw records in a rotated record file (flushed at least every interval: a
crashed consumer loses at most one interval of records).

Deliveries are acknowledged after they are counted and recorded, so a
JetStream consumer that is killed and started again resumes where it stopped;
the accounting counts each ``(publisher_id, tap, seq)`` once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from shadow_proxy.arguments import positive
from shadow_proxy.consumer.accounting import DEFAULT_GRACE_S, Accounts
from shadow_proxy.records import sources
from shadow_proxy.records.files import RecordFile

#: How often the runner looks at the stop event and the clock when idle.
IDLE_TICK_S = 0.1


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """Write the summary as JSON, atomically (a reader never sees half a file)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shadow-consumer",
        description="Count what a shadow-proxy tap publishes. Live lines go to stderr, "
        "the JSON summary to stdout at the end (Ctrl-C, SIGTERM, --duration, --max-records, "
        "or the end of the record files).",
    )
    sources.add_arguments(parser)
    parser.add_argument("--interval", type=positive(float), default=1.0, metavar="S")
    parser.add_argument("--summary-path", type=Path, metavar="FILE")
    parser.add_argument("--record", type=Path, metavar="FILE", help="keep raw records here")
    parser.add_argument("--record-max-bytes", type=positive(int), default=256 * 2**20)
    parser.add_argument("--record-keep", type=int, default=5, metavar="N")
    parser.add_argument("--duration", type=positive(float), metavar="S")
    parser.add_argument("--max-records", type=positive(int), metavar="N")
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="S",
        help="how long after a heartbeat a missing tail counts as lost",
    )
    return parser


def _live_line(summary: dict[str, Any], rate: float) -> str:
    return (
        f"records={summary['records']} ({rate:.0f}/s) "
        f"prompt_tokens={summary['prompt_tokens']} output_tokens={summary['output_tokens']} "
        f"tap_gaps={summary['tap_gaps']} tail_loss={summary['tail_loss']} "
        f"transport_gaps={summary['transport_gaps']} duplicates={summary['duplicates']} "
        f"undecodable={sum(summary['undecodable'].values())}"
    )


class _Run:
    """One consumer run: the source, the accounts, the record file, the clock."""

    def __init__(self, args: argparse.Namespace, source: sources.RecordSource, err: TextIO):
        self.args = args
        self.source = source
        self.err = err
        self.accounts = Accounts(getattr(source, "topic", None), grace=args.grace)
        self.recorder = (
            RecordFile(args.record, args.record_max_bytes, max(0, args.record_keep), args.interval)
            if args.record
            else None
        )
        self.started = time.monotonic()
        self.last_report = (self.started, 0)

    def summary(self, now: float) -> dict[str, Any]:
        summary = self.accounts.summary(now)
        undecodable = dict(summary["undecodable"])  # the source's losses count too
        for reason, n in self.source.stats.unreadable.items():
            undecodable[reason] = undecodable.get(reason, 0) + n
        summary["undecodable"] = dict(sorted(undecodable.items()))
        retries = getattr(self.source, "retries", None)  # a stream's, through outages
        return {
            "source": self.source.describe(),
            "endpoints": list(getattr(self.source, "endpoints", [])),
            "elapsed_s": round(now - self.started, 3),
            **summary,
            **({"nats_retries": retries} if retries is not None else {}),
        }

    def report(self, now: float) -> None:
        summary = self.summary(now)
        then, count = self.last_report
        rate = (summary["records"] - count) / max(now - then, 1e-9)
        print(_live_line(summary, rate), file=self.err, flush=True)
        if self.args.summary_path:
            write_summary(self.args.summary_path, summary)
        if self.recorder is not None:
            self.recorder.flush(now)
        self.last_report = (now, summary["records"])

    def done(self) -> bool:
        limit = self.args.max_records
        return limit is not None and self.accounts.records >= limit

    async def consume(self) -> None:
        """Count deliveries until the source ends or ``max_records`` arrive."""
        async for delivery in self.source:
            now = time.monotonic()
            if delivery.heartbeat is not None:
                self.accounts.on_heartbeat(delivery.message, delivery.heartbeat, now)
            elif (
                delivery.envelope is not None
                and self.accounts.on_record(delivery.message, delivery.envelope)
                and self.recorder is not None
            ):
                self.recorder.write(delivery.message)
            if self.recorder is not None and self.source.redelivers:
                self.recorder.flush(now)  # what is acknowledged is in the file
            await delivery.ack()
            if self.done():
                return


async def _run(args: argparse.Namespace, stop: threading.Event, out: TextIO, err: TextIO) -> int:
    def note(line: str) -> None:
        print(f"shadow-consumer: {line}", file=err, flush=True)

    try:
        # A consumer may start before any proxy has created its stream: it waits.
        source = sources.open_source(
            args, dedup=False, heartbeats=True, wait_for_stream=True, log=note
        )
    except sources.SourceError as e:
        note(str(e))
        return 2
    run = _Run(args, source, err)
    print(f"reading {source.describe()}", file=err)
    consuming = asyncio.create_task(run.consume())
    deadline = None if args.duration is None else run.started + args.duration
    next_report = run.started + args.interval
    try:
        while not consuming.done() and not stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if now >= next_report:
                run.report(now)
                next_report = now + args.interval
            await asyncio.wait({consuming}, timeout=min(IDLE_TICK_S, next_report - now))
    finally:
        consuming.cancel()
        refused = None
        try:
            await consuming
        except asyncio.CancelledError:
            pass
        except sources.SourceError as e:  # found when opened: a durable of another tap
            refused = e
        await source.aclose()
        if run.recorder is not None:
            run.recorder.close()
    if refused is not None:
        note(str(refused))
        return 2
    summary = run.summary(time.monotonic())
    if args.summary_path:
        write_summary(args.summary_path, summary)
    print(json.dumps(summary, indent=2), file=out, flush=True)
    return 0


def run_consumer(
    argv: Sequence[str],
    *,
    stop: threading.Event | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run until ``stop`` is set, ``--duration`` passes, ``--max-records`` arrive or
    the files end. Prints the JSON summary to ``out`` and returns 0; 2 on a usage error."""
    args = build_parser().parse_args(list(argv))
    return asyncio.run(_run(args, stop or threading.Event(), out or sys.stdout, err or sys.stderr))


def consumer_main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: SIGINT and SIGTERM end the run with the summary, exit 0."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run_consumer(sys.argv[1:] if argv is None else argv, stop=stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(consumer_main())
