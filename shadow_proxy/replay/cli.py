"""``shadow-replay SOURCE... --candidate URL --out DIR``: the command line.

Parses the arguments, opens the record files, runs one ``Replay`` on a uvloop
event loop and prints the summary's headline to stderr. Ctrl-C (SIGINT) or
SIGTERM cancels the run; the report of what was done is still written and the
exit status is 130. Exit status 2 on a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from shadow_proxy.replay.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S
from shadow_proxy.replay.runner import Replay, ReplayOptions
from shadow_proxy.replay.stats import DEFAULT_MAX_SAMPLES, DEFAULT_MIN_DIFF_MS, DEFAULT_TOLERANCE

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


# replaced by records.sources once it lands
class FileRecords:
    """Record files (``shadow-consumer --record``): paths, directories of rotated
    sets and globs, read in the order given, a rotated set oldest first
    (FILE.N ... FILE.1, FILE). Undecodable payloads are counted, never fatal.
    Each file is read whole (``read_record_file``), so memory holds one file."""

    def __init__(self, sources: Sequence[str]) -> None:
        self.files = _expand(sources)
        self.unreadable: dict[str, int] = {}

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        from shadow_proxy.consumer import read_record_file
        from shadow_proxy.wire import WireError, decode_envelope

        for path in self.files:
            for payload in read_record_file(path):
                try:
                    yield decode_envelope(payload)
                except WireError as exc:
                    self.unreadable[exc.reason] = self.unreadable.get(exc.reason, 0) + 1
            await asyncio.sleep(0)


def _rotation_key(path: Path) -> tuple[str, int]:
    stem, _, suffix = path.name.rpartition(".")
    if stem and suffix.isdigit():
        return stem, -int(suffix)
    return path.name, 0


def _expand(sources: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
        elif path.is_file():
            found = [path]
        else:
            found = [Path(p) for p in glob.glob(source) if Path(p).is_file()]
            if not found:
                msg = f"SOURCE {source!r}: no such file, directory or matching glob"
                raise ValueError(msg)
        files.extend(sorted(found, key=_rotation_key))
    return files


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


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            msg = f"must be positive (got {text!r})"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        msg = f"must be at least 0 (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shadow-replay",
        description="Replay captured requests to a candidate deployment and compare "
        "its answers with the primary's (and a baseline's).",
    )
    parser.add_argument("sources", nargs="+", metavar="SOURCE", help="record file, dir or glob")
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
    parser.add_argument("--concurrency", type=_positive(int), default=16, metavar="N")
    parser.add_argument("--max-lag-s", type=_non_negative, default=5.0, metavar="S")
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
        type=_non_negative,
        default=DEFAULT_TOLERANCE,
        help="a latency ratio counts only outside [1/(1+T), 1+T] (whole 95%% interval)",
    )
    parser.add_argument(
        "--min-diff-ms",
        type=_non_negative,
        default=DEFAULT_MIN_DIFF_MS,
        help="and only when the p50s differ by at least this many ms",
    )
    parser.add_argument("--request-id-header", default="x-request-id")
    parser.add_argument(
        "--connect-timeout-s", type=_positive(float), default=DEFAULT_CONNECT_TIMEOUT_S
    )
    parser.add_argument("--read-timeout-s", type=_positive(float), default=DEFAULT_READ_TIMEOUT_S)
    parser.add_argument("--max-samples", type=_positive(int), default=DEFAULT_MAX_SAMPLES)
    return parser


def headline(summary: dict[str, Any]) -> str:
    ttft = summary["ttft_ms"]
    return (
        f"records={summary['records']} replayed={summary['replayed']} "
        f"skipped={sum(summary['skipped'].values())} errors={summary['errors']} "
        f"exact_match_rate={summary['exact_match_rate']} "
        f"ttft ratio_p50={ttft['ratio_p50']} ({ttft['verdict']})"
    )


async def _main(replay: Replay, records: FileRecords) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await replay.run(records, lambda: records.unreadable)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        records = FileRecords(args.sources)
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
        )
        command = shlex.join(["shadow-replay", *args_list])
        replay = Replay(options, command)
    except (ValueError, OSError) as exc:
        print(f"shadow-replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    import uvloop

    summary = uvloop.run(_main(replay, records))
    print(headline(summary), file=sys.stderr)
    print(f"report: {args.out / 'report.md'}", file=sys.stderr)
    return 0 if summary["run"]["complete"] else EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
