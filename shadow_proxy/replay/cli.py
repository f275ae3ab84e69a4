"""``shadow-replay SOURCE... --candidate URL --out DIR``: the command line.

Parses the arguments, opens the record files, runs one ``Replay`` on a uvloop
event loop and prints the summary's headline to stderr. Ctrl-C (SIGINT) or
SIGTERM cancels the run; the report of what was done is still written and the
exit status is 130. Exit status 2 on a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shadow_proxy.arguments import non_negative, positive
from shadow_proxy.extras import missing_tools
from shadow_proxy.records import sources
from shadow_proxy.replay.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S
from shadow_proxy.replay.compare import DEFAULT_MAX_SAMPLES, DEFAULT_MIN_DIFF_MS, DEFAULT_TOLERANCE

if TYPE_CHECKING:
    from shadow_proxy.replay.runner import Replay

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


async def envelopes_of(
    source: sources.RecordSource, window: int = sources.DEFAULT_REORDER_WINDOW
) -> AsyncIterator[dict[str, Any]]:
    """The source's records; files re-sorted by arrival within ``window`` records
    (a record file is in publish order, and joined records are published at
    their response's end). Each delivery is acknowledged once handed on."""
    deliveries = source.deliveries()
    if not source.live:
        deliveries = sources.in_arrival_order(deliveries, window)
    try:
        async for delivery in deliveries:
            await delivery.ack()
            yield delivery.envelope
    finally:
        await source.aclose()


# --------------------------------------------------------------------------- arguments


def _speed(text: str) -> float | None:
    if text == "max":
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        msg = f"must be a positive number or 'max' (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shadow-replay",
        description="Replay captured requests to a candidate deployment and compare "
        "its answers with the primary's (and a baseline's).",
    )
    sources.add_arguments(parser)
    parser.add_argument(
        "--reorder-window",
        type=positive(int),
        default=sources.DEFAULT_REORDER_WINDOW,
        metavar="N",
        help="record files: records held to restore arrival order",
    )
    parser.add_argument("--candidate", required=True, metavar="URL", help="base URL (no /v1)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR")
    parser.add_argument(
        "--baseline", metavar="URL", help="a second deployment of the primary's build (noise)"
    )
    parser.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        metavar="X|max",
        help="divide recorded inter-arrival times by X; max: as fast as --concurrency allows",
    )
    parser.add_argument("--concurrency", type=positive(int), default=16, metavar="N")
    parser.add_argument("--max-lag-s", type=non_negative(), default=5.0, metavar="S")
    parser.add_argument("--model", metavar="NAME", help="send this model name instead")
    parser.add_argument(
        "--no-compare", action="store_true", help="replay for load only (request-only records too)"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="tokenizer.json (or its directory) to encode a candidate's text when it returns "
        "no token ids, so outputs compare token by token with the record's ids",
    )
    parser.add_argument(
        "--tolerance",
        type=non_negative(),
        default=DEFAULT_TOLERANCE,
        help="a latency ratio counts only outside [1/(1+T), 1+T] (whole 95%% interval)",
    )
    parser.add_argument(
        "--min-diff-ms",
        type=non_negative(),
        default=DEFAULT_MIN_DIFF_MS,
        help="and only when the p50s differ by at least this many ms",
    )
    parser.add_argument("--request-id-header", default="x-request-id")
    parser.add_argument(
        "--connect-timeout-s", type=positive(float), default=DEFAULT_CONNECT_TIMEOUT_S
    )
    parser.add_argument("--read-timeout-s", type=positive(float), default=DEFAULT_READ_TIMEOUT_S)
    parser.add_argument("--max-samples", type=positive(int), default=DEFAULT_MAX_SAMPLES)
    return parser


def headline(summary: dict[str, Any]) -> str:
    ttft = summary["ttft_ms"]
    return (
        f"records={summary['records']} replayed={summary['replayed']} "
        f"skipped={sum(summary['skipped'].values())} errors={summary['errors']} "
        f"exact_match_rate={summary['exact_match_rate']} "
        f"ttft ratio_p50={ttft['ratio_p50']} ({ttft['verdict']})"
    )


async def _main(replay: Replay, source: sources.RecordSource, window: int) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await replay.run(envelopes_of(source, window), lambda: source.stats.unreadable)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    missing = missing_tools(("numpy", "matplotlib"))
    if missing:
        print(f"shadow-replay: {missing}", file=sys.stderr)
        return EXIT_USAGE
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    from shadow_proxy.replay.runner import Replay, ReplayOptions

    try:
        source = sources.open_source(
            args, log=lambda line: print(f"shadow-replay: {line}", file=sys.stderr, flush=True)
        )
        options = ReplayOptions(
            candidate=args.candidate,
            out_dir=args.out,
            baseline=args.baseline,
            speed=args.speed,
            concurrency=args.concurrency,
            max_lag_s=args.max_lag_s,
            model=args.model,
            compare=not args.no_compare,
            tolerance=args.tolerance,
            min_diff_ms=args.min_diff_ms,
            tokenizer=args.tokenizer,
            request_id_header=args.request_id_header,
            connect_timeout_s=args.connect_timeout_s,
            read_timeout_s=args.read_timeout_s,
            max_samples=args.max_samples,
            live=source.live,
        )
        command = shlex.join(["shadow-replay", *args_list])
        replay = Replay(options, command)
    except (ValueError, OSError) as exc:
        print(f"shadow-replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    import uvloop

    try:
        summary = uvloop.run(_main(replay, source, args.reorder_window))
    except sources.SourceError as exc:  # found when the source opens: no such stream
        print(f"shadow-replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(headline(summary), file=sys.stderr)
    print(f"report: {args.out / 'report.md'}", file=sys.stderr)
    return 0 if summary["run"]["complete"] else EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
