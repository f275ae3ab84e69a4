"""``shadow-trace``: export captured records as traces, and report their KV-cache reuse.

    shadow-trace export SOURCE... --format mooncake|dynamo [--block-size B] -o OUT
    shadow-trace analyze SOURCE... [--block-size 16,64,512] [--json PATH] [--plot PATH.png]

Exit status: 0 done (an empty source gives an empty trace and says so on stderr),
2 bad arguments (unknown format, bad block size, unreadable source). A progress
line is drawn on stderr when it is a terminal and the run passes a few seconds.
"""

from __future__ import annotations

import argparse
import glob
import json
import shlex
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from shadow_proxy.trace.selection import Selection, TraceRequest

EXIT_USAGE = 2
PROGRESS_AFTER_S = 3.0


class SourceError(ValueError):
    """A source that cannot be read at all."""


# replaced by records.sources once it lands
def read_sources(sources: Sequence[str], unreadable: list[int]) -> Iterator[tuple[Any, int | None]]:
    """Decoded envelopes with their publisher id (None: a file does not keep it).

    A SOURCE is a record file written by ``shadow-consumer --record``, a directory
    of them, or a glob; rotated files ``F.N`` are read oldest first, then ``F``.
    Records that do not decode are counted in ``unreadable[0]``.
    """
    from shadow_proxy.consumer import read_record_file
    from shadow_proxy.wire import WireError, decode_envelope

    for path in _files(sources):
        for payload in read_record_file(path):
            try:
                yield decode_envelope(payload), None
            except WireError:
                unreadable[0] += 1


def _rotation_key(path: Path) -> tuple[str, int]:
    stem, _, suffix = path.name.rpartition(".")
    if stem and suffix.isdigit():
        return stem, -int(suffix)
    return path.name, 0


def _files(sources: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found = sorted((p for p in path.iterdir() if p.is_file()), key=_rotation_key)
        elif path.is_file():
            found = [path]
        else:
            found = sorted((Path(p) for p in glob.glob(source)), key=_rotation_key)
            found = [p for p in found if p.is_file()]
            if not found:
                msg = f"SOURCE {source!r} is not a record file, a directory or a matching glob"
                raise SourceError(msg)
        files.extend(found)
    return files


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


def _requests(
    args: argparse.Namespace, selection: Selection, unreadable: list[int]
) -> Iterator[TraceRequest]:
    progress = _Progress(sys.stderr)
    for count, (envelope, publisher) in enumerate(read_sources(args.sources, unreadable), 1):
        request = selection.take(envelope, publisher)
        if count % 1024 == 0:
            progress.tick(selection)
        if request is not None:
            yield request
    progress.done()


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

    exporter = Exporter(args.format, args.block_size, sessions=not args.no_session_id)
    selection = Selection(taps=set(args.tap) if args.tap else None)
    unreadable = [0]
    for request in _requests(args, selection, unreadable):
        exporter.add(request)
    out_path = Path(args.output)
    if args.output == "-":
        written = exporter.write(sys.stdout)
    else:
        partial = out_path.with_name(f".{out_path.name}.partial")
        with partial.open("w", encoding="utf-8") as out:
            written = exporter.write(out)
        partial.replace(out_path)
    print(_summary_line(selection, unreadable[0]), file=sys.stderr)
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

    analysis = ReuseAnalysis(args.block_size)
    selection = Selection(taps=set(args.tap) if args.tap else None)
    unreadable = [0]
    analysis.extend(_requests(args, selection, unreadable))
    print(_summary_line(selection, unreadable[0]), file=sys.stderr)
    command = "shadow-trace " + shlex.join(args.argv)
    if analysis.requests == 0:
        print(
            "shadow-trace: no request with token ids in the source; nothing to analyze",
            file=sys.stderr,
        )
    result = analysis.result()
    print(report.table(result))
    if args.json:
        document = {
            "command": command,
            "input": {**selection.summary(), "unreadable": unreadable[0]},
            "block_sizes": list(args.block_size),
            **to_json(result),
        }
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    if args.plot:
        report.plot(result, Path(args.plot), command)
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    from shadow_proxy.trace.export import FORMATS

    parser = argparse.ArgumentParser(prog="shadow-trace", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    source_help = "record file (shadow-consumer --record), directory of them, or glob"

    export = commands.add_parser("export", help="write the records as a trace (JSON lines)")
    export.add_argument("sources", nargs="+", metavar="SOURCE", help=source_help)
    export.add_argument("--format", required=True, choices=FORMATS, help="trace format")
    export.add_argument(
        "--block-size", type=_block_size, help="tokens per block [mooncake 512, dynamo 64]"
    )
    export.add_argument("-o", "--output", required=True, help="output file ('-': stdout)")
    export.add_argument("--tap", action="append", help="use only records of this tap")
    export.add_argument(
        "--no-session-id",
        action="store_true",
        help="mooncake: leave session_id out (AIPerf then replays every row as its own "
        "single-turn conversation)",
    )
    export.set_defaults(run=export_command)

    analyze = commands.add_parser("analyze", help="report KV prefix-cache reuse")
    analyze.add_argument("sources", nargs="+", metavar="SOURCE", help=source_help)
    analyze.add_argument(
        "--block-size",
        type=_block_sizes,
        default=(16, 64, 512),
        help="block sizes, comma-separated [16,64,512]",
    )
    analyze.add_argument("--json", help="write the report as JSON here")
    analyze.add_argument("--plot", help="draw hit rate against cache size to this PNG")
    analyze.add_argument("--tap", action="append", help="use only records of this tap")
    analyze.set_defaults(run=analyze_command)
    return parser


def main(argv: Iterable[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return args.run(args)
    except (SourceError, OSError) as exc:
        print(f"shadow-trace: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
