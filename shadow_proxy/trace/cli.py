"""``shadow-trace``: export captured records as traces, and report their KV-cache reuse.

    shadow-trace export SOURCE... --format mooncake|dynamo [--block-size B] -o OUT
    shadow-trace analyze SOURCE... [--block-size 16,64,512] [--capacity N] [--json PATH]
                                   [--plot PATH.png]

Exit status: 0 done (an empty source gives an empty trace and says so on stderr),
2 bad arguments (unknown format, bad block size, unreadable source). A progress
line is drawn on stderr when it is a terminal and the run passes a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from shadow_proxy.arguments import positive
from shadow_proxy.extras import missing_tools
from shadow_proxy.records import sources

if TYPE_CHECKING:
    from shadow_proxy.trace.selection import Selection, TraceRequest

EXIT_USAGE = 2
PROGRESS_AFTER_S = 3.0


class _Progress:
    """``records N, used M, R/s`` on stderr, redrawn at most once a second."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.start = time.monotonic()
        self.shown = False
        self.next = self.start + PROGRESS_AFTER_S

    def tick(self, selection: Selection) -> None:
        now = time.monotonic()
        if not self.enabled or now < self.next:
            return
        self.next = now + 1.0
        rate = selection.records / (now - self.start)
        self.stream.write(
            f"\rshadow-trace: {selection.records:,} records, {selection.kept:,} used, "
            f"{rate:,.0f} records/s "
        )
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\n")


async def _collect(
    source: sources.RecordSource,
    selection: Selection,
    *,
    max_records: int | None,
    duration_s: float | None,
) -> list[TraceRequest]:
    """Every trace request the source holds (live sources: until ``--max-records``,
    ``--duration`` or Ctrl-C). Exports and the reuse analysis order by arrival,
    so they need all of them; memory is about 4 bytes per prompt token."""
    progress = _Progress(sys.stderr)
    requests: list[TraceRequest] = []
    deadline = None if duration_s is None else time.monotonic() + duration_s

    async def read() -> None:
        async for delivery in source:
            publisher = delivery.message.publisher_id or None  # 0: a file without ids
            request = selection.take(delivery.envelope, publisher)
            if request is not None:
                requests.append(request)
            await delivery.ack()
            if selection.records % 1024 == 0:
                progress.tick(selection)
            if max_records is not None and selection.records >= max_records:
                return

    try:
        if deadline is None:
            await read()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(read(), timeout=max(0.0, deadline - time.monotonic()))
    finally:
        await source.aclose()
        progress.done()
    return requests


def _note(line: str) -> None:
    print(f"shadow-trace: {line}", file=sys.stderr, flush=True)


def _requests(args: argparse.Namespace, selection: Selection) -> tuple[list[TraceRequest], int]:
    """The trace requests of the sources, and how many records were unreadable."""
    # Selection deduplicates (also records of files without publisher ids).
    source = sources.open_source(args, dedup=False, log=_note)
    try:
        requests = asyncio.run(
            _collect(source, selection, max_records=args.max_records, duration_s=args.duration)
        )
    except KeyboardInterrupt:  # a live source: stop reading, write what was read
        requests = []
    return requests, sum(source.stats.unreadable.values())


def _summary_line(selection: Selection, unreadable: int) -> str:
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


def export_command(args: argparse.Namespace) -> int:
    from shadow_proxy.trace.export import Exporter
    from shadow_proxy.trace.selection import Selection

    exporter = Exporter(args.format, args.block_size, sessions=not args.no_session_id)
    selection = Selection(taps={args.tap} if args.tap else None)
    requests, unreadable = _requests(args, selection)
    for request in requests:
        exporter.add(request)
    out_path = Path(args.output)
    if args.output == "-":
        written = exporter.write(sys.stdout)
    else:
        partial = out_path.with_name(f".{out_path.name}.partial")
        with partial.open("w", encoding="utf-8") as out:
            written = exporter.write(out)
        partial.replace(out_path)
    print(_summary_line(selection, unreadable), file=sys.stderr)
    if written == 0:
        print(
            "shadow-trace: no request with token ids in the source; the trace is empty",
            file=sys.stderr,
        )
    else:
        where = "stdout" if args.output == "-" else str(out_path)
        print(
            f"shadow-trace: wrote {written:,} {args.format} rows "
            f"(block size {exporter.block_size}) to {where}",
            file=sys.stderr,
        )
    return 0


def analyze_command(args: argparse.Namespace) -> int:
    from shadow_proxy.trace import report
    from shadow_proxy.trace.reuse import ReuseAnalysis, to_json
    from shadow_proxy.trace.selection import Selection

    analysis = ReuseAnalysis(args.block_size)
    selection = Selection(taps={args.tap} if args.tap else None)
    requests, unreadable = _requests(args, selection)
    analysis.extend(requests)
    print(_summary_line(selection, unreadable), file=sys.stderr)
    command = "shadow-trace " + shlex.join(args.argv)
    if analysis.requests == 0:
        print(
            "shadow-trace: no request with token ids in the source; nothing to analyze",
            file=sys.stderr,
        )
    result = analysis.result()
    print(report.table(result))
    predicted = _predicted(result, args.capacity)
    for line in predicted:
        print(
            f"predicted hit rate with {line['capacity_blocks']} blocks of "
            f"{line['block_size']} tokens (LRU): {100 * line['hit_rate']:.1f}% "
            f"of {line['prompt_tokens']} prompt tokens in {line['requests']} requests"
        )
    if args.json:
        document = {
            "command": command,
            "input": {**selection.summary(), "unreadable": unreadable},
            "block_sizes": list(args.block_size),
            **to_json(result),
        }
        if predicted:
            document["predicted"] = predicted
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    if args.plot:
        report.plot(result, Path(args.plot), command)
    return 0


def _predicted(result: dict, capacity: int | None) -> list[dict]:
    """The one hit rate of an engine's cache: ``capacity`` blocks (all models),
    per block size; nothing without ``--capacity``."""
    from shadow_proxy.trace.reuse import ALL

    if capacity is None:
        return []
    return [
        {
            "block_size": block,
            "capacity_blocks": capacity,
            "hit_rate": curve.hit_rate(capacity),
            "requests": curve.requests,
            "prompt_tokens": curve.prompt_tokens,
        }
        for block, curve in sorted(result.get(ALL, {}).items())
    ]


def _capacity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"'--capacity' must be a positive number of blocks (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return value


def _block_sizes(text: str) -> tuple[int, ...]:
    from shadow_proxy.trace.reuse import parse_block_sizes

    try:
        return parse_block_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _block_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"'--block-size' must be a positive integer (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return value


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    sources.add_arguments(parser)
    parser.add_argument(
        "--max-records", type=positive(int), metavar="N", help="stop reading after N records"
    )
    parser.add_argument(
        "--duration", type=float, metavar="S", help="stop reading a live source after S seconds"
    )


def build_parser() -> argparse.ArgumentParser:
    from shadow_proxy.trace.export import FORMATS

    parser = argparse.ArgumentParser(prog="shadow-trace", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    export = commands.add_parser("export", help="write the records as a trace (JSON lines)")
    _source_arguments(export)
    export.add_argument("--format", required=True, choices=FORMATS, help="trace format")
    export.add_argument(
        "--block-size", type=_block_size, help="tokens per block [mooncake 512, dynamo 64]"
    )
    export.add_argument("-o", "--output", required=True, help="output file ('-': stdout)")
    export.add_argument(
        "--no-session-id",
        action="store_true",
        help="mooncake: leave session_id out (AIPerf then replays every row as its own "
        "single-turn conversation)",
    )
    export.set_defaults(run=export_command)

    analyze = commands.add_parser("analyze", help="report KV prefix-cache reuse")
    _source_arguments(analyze)
    analyze.add_argument(
        "--block-size",
        type=_block_sizes,
        default=(16, 64, 512),
        help="block sizes, comma-separated [16,64,512]",
    )
    analyze.add_argument(
        "--capacity",
        type=_capacity,
        help="the engine's cache in blocks (vLLM: num_gpu_blocks - 1): print the one "
        "predicted hit rate at that capacity, per block size",
    )
    analyze.add_argument("--json", help="write the report as JSON here")
    analyze.add_argument("--plot", help="draw hit rate against cache size to this PNG")
    analyze.set_defaults(run=analyze_command)
    return parser


def main(argv: Iterable[str] | None = None) -> int:
    missing = missing_tools()
    if missing:
        print(f"shadow-trace: {missing}", file=sys.stderr)
        return EXIT_USAGE
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return args.run(args)
    except (sources.SourceError, OSError) as exc:
        print(f"shadow-trace: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
