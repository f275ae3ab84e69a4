"""``shadow-trace``: export captured records as traces, and report their KV-cache reuse.

    shadow-trace export SOURCE... --format mooncake|dynamo [--block-size B] -o OUT
    shadow-trace export SOURCE... --format parquet -o OUT.parquet
    shadow-trace analyze SOURCE... [--block-size 16,64,512] [--capacity N] [--json PATH]
                                   [--plot PATH.png]

Reading ends with the files, at ``--max-records`` or ``--duration``, at a
stream's end with ``--stop-at-end``, or on Ctrl-C (SIGINT) or SIGTERM: what was
read is exported or analysed. JetStream records are acknowledged only once the
output is written (and not at all when it is not, so the next run reads them).

Exit status: 0 done; 2 bad arguments (unknown format, bad block size,
unreadable source) or nothing to work on (no records, or none with token ids:
one line says which, and nothing is written). A progress line is drawn on
stderr when it is a terminal and the run passes a few seconds (with the share
of the record files read and an ETA).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from shadow_proxy.arguments import positive
from shadow_proxy.extras import missing_tools
from shadow_proxy.records import sources
from shadow_proxy.trace.reading import collect

if TYPE_CHECKING:
    from shadow_proxy.trace.reading import Sink
    from shadow_proxy.trace.selection import Selection, TraceRequest

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: ``export -o -`` whose reader closed the pipe (``| head``): not an error.
EXIT_CLOSED = -1


def _note(line: str) -> None:
    print(f"shadow-trace: {line}", file=sys.stderr, flush=True)


def _run(
    args: argparse.Namespace,
    selection: Selection,
    produce: Callable[[list[TraceRequest]], int],
    sink: Sink | None = None,
) -> int:
    """Read the source, then ``produce`` the output from what was read (it returns
    an exit status); JetStream records are acknowledged once it returned 0. With
    ``sink`` each request goes there as it is read (none are kept)."""

    async def main() -> int:
        # Selection deduplicates (also records of files without publisher ids).
        source = sources.open_source(args, dedup=False, log=_note)
        try:
            await source.open()
            requests, acks = await collect(
                source,
                selection,
                max_records=args.max_records,
                duration_s=args.duration,
                sink=sink,
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


def _nothing_to_do(selection: Selection, unreadable: int) -> str | None:
    """Why there is nothing to export or analyse (say it, exit 2), or None."""
    if selection.records == 0:
        extra = f" ({unreadable:,} unreadable entries)" if unreadable else ""
        return f"no records in the source{extra}"
    if selection.kept == 0:
        return "no request with token ids in the source (see above)"
    return None


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


def export_parquet(args: argparse.Namespace) -> int:
    """One row per record (``trace/parquet.py``), written as the records are read."""
    from shadow_proxy.trace.parquet import ParquetExport
    from shadow_proxy.trace.selection import Selection

    if args.output == "-":
        _note("--format parquet writes a file: give -o PATH")
        return EXIT_USAGE
    selection = Selection(taps={args.tap} if args.tap else None)
    export = ParquetExport(Path(args.output))

    def produce(requests: list[TraceRequest]) -> int:
        print(_summary_line(selection, args.unreadable), file=sys.stderr)
        nothing = _nothing_to_do(selection, args.unreadable)
        if nothing is not None:
            export.abort()
            _note(f"{nothing}: nothing written")
            return EXIT_USAGE
        written = export.close()
        _note(f"wrote {written:,} rows in {export.row_groups} row groups to {args.output}")
        return 0

    try:
        return _run(args, selection, produce, sink=export.add)
    finally:
        if export.partial.exists():  # not moved into place: nothing to keep
            export.abort()


def export_command(args: argparse.Namespace) -> int:
    from shadow_proxy.trace.export import Exporter
    from shadow_proxy.trace.selection import Selection

    if args.format == "parquet":
        return export_parquet(args)
    exporter = Exporter(args.format, args.block_size, sessions=args.session_id)
    selection = Selection(taps={args.tap} if args.tap else None)

    def produce(requests: list[TraceRequest]) -> int:
        print(_summary_line(selection, args.unreadable), file=sys.stderr)
        nothing = _nothing_to_do(selection, args.unreadable)
        if nothing is not None:
            _note(f"{nothing}: no trace written")
            return EXIT_USAGE
        for request in requests:
            exporter.add(request)
        out_path = Path(args.output)
        if args.output == "-":
            try:
                written = exporter.write(sys.stdout)
                sys.stdout.flush()
            except BrokenPipeError:  # `| head`: the reader has what it wanted
                _quiet_stdout()
                return EXIT_CLOSED
        else:
            partial = out_path.with_name(f".{out_path.name}.partial")
            with partial.open("w", encoding="utf-8") as out:
                written = exporter.write(out)
            partial.replace(out_path)
        where = "stdout" if args.output == "-" else str(out_path)
        _note(f"wrote {written:,} {args.format} rows (block size {exporter.block_size}) to {where}")
        return 0

    code = _run(args, selection, produce)
    return 0 if code == EXIT_CLOSED else code


def _quiet_stdout() -> None:
    """stdout's reader went away: send what is left to /dev/null, so that the
    interpreter's flush at exit raises nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def analyze_command(args: argparse.Namespace) -> int:
    from shadow_proxy.trace import report
    from shadow_proxy.trace.reuse import ReuseAnalysis, to_json
    from shadow_proxy.trace.selection import Selection

    analysis = ReuseAnalysis(args.block_size)
    selection = Selection(taps={args.tap} if args.tap else None)
    command = "shadow-trace " + shlex.join(args.argv)

    def produce(requests: list[TraceRequest]) -> int:
        print(_summary_line(selection, args.unreadable), file=sys.stderr)
        nothing = _nothing_to_do(selection, args.unreadable)
        if nothing is not None:
            _note(f"{nothing}: nothing to analyze")
            return EXIT_USAGE
        analysis.extend(requests)
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
                "input": {**selection.summary(), "unreadable": args.unreadable},
                "block_sizes": list(args.block_size),
                **to_json(result),
            }
            if predicted:
                document["predicted"] = predicted
            Path(args.json).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        if args.plot:
            report.plot(result, Path(args.plot), command)
        return 0

    return _run(args, selection, produce)


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
        "--duration",
        type=positive(float),
        metavar="S",
        help="stop reading a live source after S seconds",
    )


def build_parser() -> argparse.ArgumentParser:
    from shadow_proxy.trace.export import FORMATS

    parser = argparse.ArgumentParser(prog="shadow-trace", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    export = commands.add_parser(
        "export", help="write the records as a trace (JSON lines) or a Parquet table"
    )
    _source_arguments(export)
    export.add_argument(
        "--format",
        required=True,
        choices=(*FORMATS, "parquet"),
        help="trace format, or parquet: one row per record (typed columns, docs/trace.md)",
    )
    export.add_argument(
        "--block-size", type=_block_size, help="tokens per block [mooncake 512, dynamo 64]"
    )
    export.add_argument("-o", "--output", required=True, help="output file ('-': stdout)")
    sessions = export.add_mutually_exclusive_group()
    sessions.add_argument(
        "--session-id",
        action="store_true",
        help="mooncake: add each request's session_id (AIPerf then reads a session's rows as "
        "the turns of one conversation, each row's input as new input, and its completions "
        "endpoint refuses a second turn: for tools that group rows by session)",
    )
    sessions.add_argument(
        "--no-session-id",
        dest="session_id",
        action="store_false",
        help="mooncake: leave session_id out (the default: every row is a whole prompt, "
        "which AIPerf replays as it is)",
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
    except KeyboardInterrupt:  # Ctrl-C while writing: nothing acknowledged
        print("shadow-trace: interrupted; nothing written in full", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
