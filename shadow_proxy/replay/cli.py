"""``shadow-replay SOURCE... --candidate URL --out DIR``: the command line.

Parses the arguments (a target URL must be http(s)), opens the source,
checks that every target answers ``GET /v1/models``, runs one ``Replay`` on a
uvloop event loop and prints the summary's headline to stderr.

Exit status:

- 0: done (the source's end, ``--max-records``, ``--duration``), and also when
  SIGTERM stopped it (a service being stopped: the report is written);
- 1: the replay ran but every request to a target failed, or the run failed
  (the report of what was done is written);
- 2: a usage error, an unreadable or empty source (no records, or none that
  could be replayed), a target that does not answer ``/v1/models``;
- 130: Ctrl-C (SIGINT) stopped it; the report of what was done is written.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shadow_proxy.arguments import fraction, non_negative, positive
from shadow_proxy.extras import missing_tools
from shadow_proxy.records import sources
from shadow_proxy.replay.outcome import EXIT_FAILED, EXIT_USAGE, headline, nothing_to_show

if TYPE_CHECKING:
    from shadow_proxy.replay.runner import Replay

EXIT_INTERRUPTED = 130
#: A stream's records are held unacknowledged while they are reordered: at
#: most this many (a durable lets 4,096 be unacknowledged at once).
REDELIVERING_WINDOW = 1024


async def deliveries_of(
    source: sources.RecordSource,
    window: int = sources.DEFAULT_REORDER_WINDOW,
    deliveries: AsyncIterable[sources.Delivery] | None = None,
) -> AsyncIterator[sources.Delivery]:
    """The source's deliveries (or ``deliveries``, the source's limited: N
    records read means N taken from the source); files (and streams read to
    their end) re-sorted by arrival within ``window`` records (a record file is
    in publish order, and joined records are published at their response's
    end). The replay acknowledges each once its pair is written, so the source
    stays open after the last one (its caller closes it)."""
    stream: AsyncIterable[sources.Delivery] = (
        source.deliveries() if deliveries is None else deliveries
    )
    if not source.live:
        if source.redelivers:
            window = min(window, REDELIVERING_WINDOW)
        stream = sources.in_arrival_order(aiter(stream), window)
    async for delivery in stream:
        yield delivery


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


def _url(text: str) -> str:
    from shadow_proxy.replay.client import check_url

    try:
        return check_url(text, "URL")
    except ValueError:
        msg = f"must be an http:// or https:// URL (got {text!r})"
        raise argparse.ArgumentTypeError(msg) from None


def build_parser() -> argparse.ArgumentParser:
    from shadow_proxy.replay.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S
    from shadow_proxy.replay.options import add_closed_loop_arguments
    from shadow_proxy.replay.request import DEFAULT_REQUEST_ID_HEADER
    from shadow_proxy.replay.stats import DEFAULT_MAX_SAMPLES
    from shadow_proxy.replay.verdicts import (
        DEFAULT_MAX_ERROR_RATE,
        DEFAULT_MIN_DIFF_MS,
        DEFAULT_TOLERANCE,
        DEFAULT_TOLERANCE_WITHOUT_BASELINE,
    )

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
        help="record files: records held to restore arrival order [%(default)s]",
    )
    parser.add_argument(
        "--max-records", type=positive(int), metavar="N", help="stop after reading N records"
    )
    parser.add_argument(
        "--duration",
        type=positive(float),
        metavar="S",
        help="stop reading after S seconds (a live source); what was sent is finished",
    )
    parser.add_argument(
        "--candidate", required=True, type=_url, metavar="URL", help="base URL (no /v1)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where pairs.jsonl, summary.json, report.md and the plots go "
        "(required but with --metrics-port)",
    )
    parser.add_argument(
        "--baseline",
        type=_url,
        metavar="URL",
        help="a second deployment of the primary's build (noise)",
    )
    parser.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        metavar="X|max",
        help="divide recorded inter-arrival times by X; max: as fast as --concurrency allows",
    )
    parser.add_argument(
        "--concurrency",
        type=positive(int),
        default=16,
        metavar="N",
        help="requests in flight per deployment [%(default)s]",
    )
    parser.add_argument(
        "--max-lag-s",
        type=non_negative(),
        default=5.0,
        metavar="S",
        help="skip (and count as late) a record not sent within S s of its due time [%(default)s]",
    )
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
        metavar="T",
        help="a latency ratio counts only outside [1/(1+T), 1+T] (whole 95%% interval) "
        f"[{DEFAULT_TOLERANCE} with --baseline; {DEFAULT_TOLERANCE_WITHOUT_BASELINE} without: "
        "the primary was measured on another path, through the frontend's tokenizer]",
    )
    parser.add_argument(
        "--min-diff-ms",
        type=non_negative(),
        default=DEFAULT_MIN_DIFF_MS,
        help="and only when the p50s differ by at least this many ms [%(default)s]",
    )
    parser.add_argument(
        "--max-error-rate",
        type=fraction,
        default=DEFAULT_MAX_ERROR_RATE,
        metavar="F",
        help="no latency verdict when more than this fraction of a target's requests "
        "failed [%(default)s]",
    )
    parser.add_argument(
        "--request-id-header",
        default=DEFAULT_REQUEST_ID_HEADER,
        metavar="NAME",
        help="the header that carries each target's request id (the record's id with "
        "-candidate or -baseline; the record's own in x-shadow-original-request-id) "
        "[%(default)s]",
    )
    parser.add_argument(
        "--connect-timeout-s",
        type=positive(float),
        default=DEFAULT_CONNECT_TIMEOUT_S,
        metavar="S",
        help="a target that does not accept a connection in S s fails that request "
        "(error 'timeout') [%(default)s]",
    )
    parser.add_argument(
        "--read-timeout-s",
        type=positive(float),
        default=DEFAULT_READ_TIMEOUT_S,
        metavar="S",
        help="a target that sends nothing for S s (before or within its answer) fails that "
        "request (error 'timeout'); there is no limit on a whole generation [%(default)s]",
    )
    parser.add_argument(
        "--score",
        action="store_true",
        help="also score the recorded outputs, teacher-forced (needs --baseline; vLLM)",
    )
    parser.add_argument(
        "--score-top-k",
        type=positive(int),
        default=10,
        metavar="K",
        help="--score: log-probabilities asked per position [%(default)s]",
    )
    parser.add_argument(
        "--max-samples",
        type=positive(int),
        default=DEFAULT_MAX_SAMPLES,
        metavar="N",
        help="latency samples kept for percentiles and plots (a uniform sample past N) "
        "[%(default)s]",
    )
    add_closed_loop_arguments(parser)
    from shadow_proxy.replay import service

    service.add_arguments(parser)
    return parser


async def _main(
    replay: Replay, source: sources.RecordSource, window: int, stopped: list[int]
) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def stop(sig: int) -> None:
        stopped.append(sig)
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    try:
        await source.open()  # what is replayed first: a missing stream is said before a target
        await replay.check_targets()
        limited = replay.limit(source.deliveries())
        records = deliveries_of(source, window, limited)
        return await replay.run(records, lambda: source.stats.unreadable, limited=limited)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await source.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    missing = missing_tools(("numpy", "matplotlib"))
    if missing:
        print(f"shadow-replay: {missing}", file=sys.stderr)
        return EXIT_USAGE
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.score and (args.baseline is None or args.no_compare):
        parser.error("--score needs --baseline (the noise floor) and cannot go with --no-compare")
    if args.out is None and args.metrics_port is None:
        parser.error("the following arguments are required: --out")
    from shadow_proxy.replay import service
    from shadow_proxy.replay.client import TargetUnavailable
    from shadow_proxy.replay.runner import Replay, ReplayOptions

    def say(line: str) -> None:
        print(f"shadow-replay: {line}", file=sys.stderr, flush=True)

    try:
        source = sources.open_source(args, log=say)
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
            max_error_rate=args.max_error_rate,
            tokenizer=args.tokenizer,
            request_id_header=args.request_id_header,
            connect_timeout_s=args.connect_timeout_s,
            read_timeout_s=args.read_timeout_s,
            max_samples=args.max_samples,
            max_records=args.max_records,
            duration_s=args.duration,
            live=source.live,
            score=args.score,
            score_top_k=args.score_top_k,
            closed_loop=args.closed_loop,
            warmup=args.warmup,
            warmup_s=args.warmup_s,
        )
        command = shlex.join(["shadow-replay", *args_list])
        live = (
            service.make_observer(options, args.window_s) if args.metrics_port is not None else None
        )
        replay = Replay(options, command, observer=live)
    except (ValueError, OSError) as exc:
        say(str(exc))
        return EXIT_USAGE
    if isinstance(source, sources.FileSource):
        replay.progress_of = source.progress
    import uvloop

    if live is not None:
        return service.main(replay, live, source, args, say, headline)
    stopped: list[int] = []
    report = args.out / "report.md"
    try:
        summary = uvloop.run(_main(replay, source, args.reorder_window, stopped))
    except (sources.SourceError, TargetUnavailable) as exc:  # found before any work
        say(str(exc))
        return EXIT_USAGE
    except asyncio.CancelledError:  # a signal before the run started
        return 0 if stopped and stopped[0] == signal.SIGTERM else EXIT_INTERRUPTED
    except Exception as exc:  # the run failed; its report was written
        say(f"the replay failed: {type(exc).__name__}: {exc}; what was done: {report}")
        return EXIT_FAILED
    problem = None if stopped else nothing_to_show(summary)
    if problem is not None and summary["replayed"] == 0:
        say(problem[1])
        return problem[0]
    print(headline(summary), file=sys.stderr)
    if "score" in summary:
        print(
            f"score: {summary['score']['verdict']}: {summary['score']['reason']}", file=sys.stderr
        )
    print(f"report: {report}", file=sys.stderr)
    if stopped:
        return 0 if stopped[0] == signal.SIGTERM else EXIT_INTERRUPTED
    if problem is not None:
        say(problem[1])
        return problem[0]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
