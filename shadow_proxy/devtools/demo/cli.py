"""``shadow-proxy demo``: the command line, and the runs one after the other.

``run_demo`` runs when the command starts: it parses the options, checks that
the tokenizer directory exists (exit 2 otherwise), starts the built-in
frontend unless ``--frontend`` names one, carries out each run in turn and
prints its table, and writes the results as JSON with ``--json``. SIGTERM ends
the demo as Ctrl-C does. Guarantees: every process it started is stopped
before it returns; the exit status is 0 when every run's accounting holds, 1
when one does not or a run could not be carried out, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from shadow_proxy.devtools.demo.run import run_once
from shadow_proxy.devtools.demo.runs import DemoError, RunOptions, plan
from shadow_proxy.devtools.demo.services import builtin_frontend, check_frontend
from shadow_proxy.devtools.demo.table import format_table
from shadow_proxy.devtools.processes import ChildExited, WaitTimeout


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except where there is none (None: decided later)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The demo's options (runs when the command starts); defaults are the reference load."""
    parser = argparse.ArgumentParser(
        prog="shadow-proxy demo",
        description="Frontend, proxy with the reference taps, one consumer per tap and a "
        "load; prints what the clients, the proxy and the consumers saw. Without --stream, "
        "--no-stream or --cancel-fraction: the three reference runs.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--requests", type=_positive_int, default=200, help="requests per run")
    parser.add_argument(
        "--concurrency", type=_positive_int, default=16, help="requests in flight at once"
    )
    parser.add_argument(
        "--isl",
        type=_positive_int,
        default=512,
        help="prompt tokens (about: of the model's tokenizer, counted before the run)",
    )
    parser.add_argument("--osl", type=_positive_int, default=32, help="output tokens")
    parser.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stream the answers (a single run; default on)",
    )
    parser.add_argument(
        "--cancel-fraction",
        type=_fraction,
        default=None,
        metavar="F",
        help="fraction of requests the client cancels (a single run; default 0)",
    )
    parser.add_argument(
        "--runs",
        choices=("reference", "single"),
        default=None,
        help="reference: streaming, non-streaming, streaming with 25%% cancelled "
        "(default unless --stream, --no-stream or --cancel-fraction is given)",
    )
    parser.add_argument(
        "--frontend",
        metavar="URL",
        help="a running OpenAI-compatible frontend (default: start the built-in one)",
    )
    parser.add_argument("--model", default="deepseek", help="the model name requests use")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=Path(".models/deepseek"),
        metavar="DIR",
        help="the model's local tokenizer directory (the proxy's, and the built-in frontend's)",
    )
    parser.add_argument(
        "--ttft-ms", type=float, default=20.0, help="the built-in frontend's time to first token"
    )
    parser.add_argument(
        "--itl-ms", type=float, default=5.0, help="the built-in frontend's time per output token"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = f"must be at least 1 (got {text})"
        raise argparse.ArgumentTypeError(msg)
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        msg = f"must be between 0 and 1 (got {text})"
        raise argparse.ArgumentTypeError(msg)
    return value


@contextlib.contextmanager
def _log_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="shadow-proxy-demo-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run_all(args: argparse.Namespace, runs: list[RunOptions], out: IO[str]) -> list[dict]:
    """Runs once per demo: the frontend (started or checked), then each run in
    turn, its table printed as soon as it ends. Returns every run's result."""
    results = []
    with _log_dir() as log_dir:
        async with contextlib.AsyncExitStack() as stack:
            if args.frontend:
                frontend = args.frontend.rstrip("/")
                await check_frontend(frontend, args.model)
            else:
                print(
                    f"starting the built-in frontend (ttft {args.ttft_ms:g} ms, "
                    f"itl {args.itl_ms:g} ms) ...",
                    file=out,
                    flush=True,
                )
                frontend = await stack.enter_async_context(
                    builtin_frontend(
                        {args.model: args.tokenizer}, args.ttft_ms, args.itl_ms, log_dir
                    )
                )
            for number, run in enumerate(runs, 1):
                run_dir = log_dir / f"run-{number}"
                run_dir.mkdir()
                print(f"\nrun {number}/{len(runs)}: {run.title} ...", file=out, flush=True)
                result = await run_once(run, frontend, run_dir)
                results.append(result)
                print(format_table(result), file=out, flush=True)
    return results


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends the demo as Ctrl-C does: every child is stopped first."""
    raise KeyboardInterrupt


def run_demo(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Entry point of ``shadow-proxy demo``: 0 if every run's accounting holds."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    args.tokenizer = args.tokenizer.resolve()
    if not (args.tokenizer / "tokenizer.json").exists():
        print(
            f"demo: no tokenizer.json in {args.tokenizer} (build the local model directories "
            "with `make models`, or pass --tokenizer DIR)",
            file=sys.stderr,
        )
        return 2
    runs = plan(args)
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = asyncio.run(run_all(args, runs, out))
    except (DemoError, ChildExited, WaitTimeout) as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    ok = all(r["ok"] for r in results)
    elapsed = time.monotonic() - started
    if len(results) > 1:
        passed = sum(r["ok"] for r in results)
        print(f"\n{passed}/{len(results)} runs OK in {elapsed:.1f} s", file=out)
    if args.json:
        args.json.write_text(
            json.dumps({"ok": ok, "elapsed_s": round(elapsed, 2), "runs": results}, indent=2)
            + "\n",
            encoding="utf-8",
        )
    return 0 if ok else 1
