"""``shadow-consumer --nats URL --stream S --tap NAME --durable NAME``: the consumer
reading a JetStream stream instead of a live ZeroMQ tap (SPEC 7 and 9).

Same totals, live line, summary and record file as the ZeroMQ runner, with the
stream's order of work: fetch a batch from the durable, count each record
(``Accounts.on_envelope``: a ``(publisher_id, seq)`` seen before is a
duplicate, never counted twice), write the new ones to the record file and
flush it, and only then acknowledge the batch. A consumer killed at any point
loses nothing: what it had not acknowledged is delivered again, to it when it
restarts or to another process on the same durable. ``--max-records N``
acknowledges only the records it counted; the rest stay for the next reader.

There is no transport sequence here (JetStream keeps order and stores each
message once); ``tap_gaps`` and ``tail_loss`` (from the heartbeats the tap
writes to ``{subject}.heartbeat``) say what the tap dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import nats.errors

from shadow_proxy.consumer import (
    Accounts,
    RecordFile,
    _live_line,
    _with_run,
    write_summary,
)
from shadow_proxy.records.jetstream_source import JetStreamSource, SourceError, default_subject

#: How long one fetch waits for records before the loop looks at the clock.
FETCH_WAIT_S = 0.5
OPEN_POLL_S = 0.1


def run_jetstream(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    *,
    stop: threading.Event,
    out: TextIO | None,
    err: TextIO | None,
) -> int:
    """Run until ``stop``, ``--duration`` or ``--max-records``; print the summary."""
    if not args.tap or not args.durable:
        parser.error("--nats needs --tap NAME and --durable NAME")
    subject = args.subject or default_subject(args.tap, args.topic)
    return asyncio.run(_run(args, subject, stop, out or sys.stdout, err or sys.stderr))


async def _run(
    args: argparse.Namespace, subject: str, stop: threading.Event, out: TextIO, err: TextIO
) -> int:
    accounts = Accounts(subject, grace=args.grace)
    source = JetStreamSource(
        servers=list(args.nats),
        tap=args.tap,
        durable=args.durable,
        stream=args.stream,
        subject=subject,
        ack_wait_s=args.ack_wait,
        on_heartbeat=lambda beat: accounts.on_heartbeat(beat, time.monotonic()),
        rejected=accounts.undecodable,
    )
    recorder = (
        RecordFile(args.record, args.record_max_bytes, max(0, args.record_keep))
        if args.record
        else None
    )
    started = time.monotonic()
    deadline = None if args.duration is None else started + args.duration
    run: dict[str, Any] = {"stream": args.stream, "durable": args.durable}

    def summary(now: float) -> dict[str, Any]:
        return {**_with_run(accounts.summary(now), list(args.nats), now - started), **run}

    opening = asyncio.create_task(source.open())
    try:
        while not opening.done():
            if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                opening.cancel()
                break
            await asyncio.wait({opening}, timeout=OPEN_POLL_S)
        if not opening.cancelled():
            try:
                opening.result()
            except (SourceError, nats.errors.Error, OSError) as e:
                print(f"shadow-consumer: {e}", file=err)
                return 2
            print(
                f"reading stream={args.stream} subject={subject} durable={args.durable} "
                f"servers={','.join(args.nats)}",
                file=err,
            )
            await _loop(args, source, accounts, recorder, stop, deadline, summary, err)
    finally:
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError, SourceError, nats.errors.Error, OSError):
            await opening
        await source.close()
        if recorder is not None:
            recorder.close()
    final = summary(time.monotonic())
    if args.summary_path:
        write_summary(args.summary_path, final)
    print(json.dumps(final, indent=2), file=out, flush=True)
    return 0


async def _loop(
    args: argparse.Namespace,
    source: JetStreamSource,
    accounts: Accounts,
    recorder: RecordFile | None,
    stop: threading.Event,
    deadline: float | None,
    summary: Callable[[float], dict[str, Any]],
    err: TextIO,
) -> None:
    next_report = time.monotonic() + args.interval
    last_report = (time.monotonic(), 0)
    while not stop.is_set():
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            break
        if args.max_records is not None and accounts.records >= args.max_records:
            break
        if now >= next_report:
            current = summary(now)
            rate = (current["records"] - last_report[1]) / max(now - last_report[0], 1e-9)
            print(_live_line(current, rate), file=err, flush=True)
            if args.summary_path:
                write_summary(args.summary_path, current)
            last_report = (now, current["records"])
            next_report = now + args.interval
        records = await source.fetch(max(0.05, min(FETCH_WAIT_S, next_report - now)))
        handled = []
        for record in records:
            if args.max_records is not None and accounts.records >= args.max_records:
                break
            if accounts.on_envelope(record.publisher_id, record.envelope) and recorder:
                recorder.write(record.payload)
            handled.append(record)
        if recorder is not None:
            recorder.flush()
        if handled:
            await source.ack(handled)
        if len(handled) < len(records):
            await source.release(records[len(handled) :])
