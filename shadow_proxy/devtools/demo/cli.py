"""``shadow-proxy demo``: the command line, and the runs one after the other.

``run_demo`` runs when the command starts: it parses the options, checks that
the tokenizer directory exists and that the tools the chosen runs need are
installed (exit 2 otherwise), starts a local nats-server with ``--transport
nats``, starts the built-in frontend unless ``--frontend`` names one, carries
out each run in turn and prints its table (the replay run is left out, and
says so, in front of a given frontend: it needs built-in ones), and writes the
results as JSON with ``--json``. Records and reports are kept in ``--out``
(default: a new directory under the system's temporary directory, named at
the end). SIGTERM ends the demo as Ctrl-C does. Guarantees: every process it
started is stopped before it returns; the exit status is 0 when every run's
accounting holds and every process exited with status 0, 1 when one does not
or a run could not be carried out, 130 when interrupted.
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

from shadow_proxy.arguments import fraction, non_negative, positive
from shadow_proxy.devtools.demo.multiturn import add_reuse, format_reuse
from shadow_proxy.devtools.demo.replay import format_replay, replay_run
from shadow_proxy.devtools.demo.run import run_once
from shadow_proxy.devtools.demo.runs import RUN_SETS, DemoError, ReplayPlan, RunOptions, plan
from shadow_proxy.devtools.demo.services import FrontendKnobs, builtin_frontends, check_frontend
from shadow_proxy.devtools.demo.table import format_table
from shadow_proxy.devtools.demo.transport import TRANSPORTS, demo_nats_server, nats_taps, zmq_taps
from shadow_proxy.devtools.nats_server import NatsServerUnavailable
from shadow_proxy.devtools.processes import ChildExited, WaitTimeout
from shadow_proxy.extras import missing_tools


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
    parser.add_argument("--requests", type=positive(int), default=200, help="requests per run")
    parser.add_argument(
        "--concurrency", type=positive(int), default=16, help="requests in flight at once"
    )
    parser.add_argument(
        "--isl",
        type=positive(int),
        default=512,
        help="prompt tokens (about: of the model's tokenizer, counted before the run)",
    )
    parser.add_argument("--osl", type=positive(int), default=32, help="output tokens")
    parser.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stream the answers (a single run; default on)",
    )
    parser.add_argument(
        "--cancel-fraction",
        type=fraction,
        default=None,
        metavar="F",
        help="fraction of requests the client cancels (a single run; default 0)",
    )
    parser.add_argument(
        "--api",
        choices=("chat", "completions", "responses"),
        default=None,
        help="the route a single run uses (a single run; default chat)",
    )
    parser.add_argument(
        "--runs",
        choices=RUN_SETS,
        default=None,
        help="all: the four reference runs (chat streaming, non-streaming, 25%% cancelled; "
        "Responses streaming, 25%% cancelled), the multi-turn run and the replay run; "
        "reference, multi-turn or replay: that part alone (replay with the first reference "
        "run it replays); single: one run of the load options (default: all, or single "
        "when --stream, --no-stream, --cancel-fraction or --api is given)",
    )
    parser.add_argument(
        "--conversations", type=positive(int), default=20, help="multi-turn: conversations"
    )
    parser.add_argument("--turns", type=positive(int), default=8, help="multi-turn: turns each")
    parser.add_argument(
        "--candidate-extra-ttft-ms",
        type=non_negative(),
        default=50.0,
        help="replay: the candidate's time to first token above the primary's",
    )
    parser.add_argument(
        "--candidate-extra-itl-ms",
        type=non_negative(),
        default=5.0,
        help="replay: the candidate's time per output token above the primary's",
    )
    parser.add_argument(
        "--candidate-diverge-fraction",
        type=fraction,
        default=0.2,
        metavar="F",
        help="replay: fraction of requests (by request id) whose output the candidate changes",
    )
    parser.add_argument(
        "--candidate-diverge-at",
        type=non_negative(int),
        default=4,
        metavar="N",
        help="replay: the output token position where the candidate's output changes",
    )
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="zmq",
        help="how the taps publish: zmq, or nats (starts a local nats-server; the runs go "
        "through JetStream)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where records and reports are kept (default: a new temporary directory)",
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


@contextlib.contextmanager
def _log_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="shadow-proxy-demo-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run_all(
    args: argparse.Namespace,
    runs: list[RunOptions | ReplayPlan],
    out: IO[str],
    out_dir: Path,
    services: dict[str, int],
) -> list[dict]:
    """Runs once per demo: the nats-server (``--transport nats``), the frontend
    (started or checked), then each run in turn, its table printed as soon as it
    ends. Returns every run's result; ``services`` gets the exit status of each
    process that served every run."""
    results: list[dict] = []
    by_number: dict[int, dict] = {}
    models = {args.model: args.tokenizer}
    primary = FrontendKnobs(args.ttft_ms, args.itl_ms)
    with _log_dir() as log_dir:
        async with contextlib.AsyncExitStack() as stack:
            servers: list[str] = []
            if args.transport == "nats":
                print("starting a local nats-server (JetStream) ...", file=out, flush=True)
                servers = await asyncio.to_thread(
                    stack.enter_context, demo_nats_server(log_dir / "nats", services)
                )
            if args.frontend:
                frontend = args.frontend.rstrip("/")
                await check_frontend(frontend, args.model)
            else:
                print(
                    f"starting the built-in frontend ({primary.describe()}) ...",
                    file=out,
                    flush=True,
                )
                urls = await stack.enter_async_context(
                    builtin_frontends(models, {"frontend": primary}, log_dir, services)
                )
                frontend = urls["frontend"]
            for number, run in enumerate(runs, 1):
                run_dir = log_dir / f"run-{number}"
                run_dir.mkdir()
                print(f"\nrun {number}/{len(runs)}: {run.title} ...", file=out, flush=True)
                if isinstance(run, ReplayPlan):
                    if args.frontend:
                        print(
                            "left out: the replay run needs the built-in frontends (a candidate "
                            "and a baseline beside the primary); run it without --frontend",
                            file=out,
                            flush=True,
                        )
                        continue
                    result = await replay_run(
                        run,
                        by_number[run.source_run],
                        models,
                        primary,
                        args.tokenizer,
                        out_dir,
                        run_dir,
                    )
                    text = format_replay(result)
                else:
                    taps = nats_taps(servers, number) if servers else zmq_taps()
                    record_dir = out_dir / f"run-{number}"
                    record_dir.mkdir(parents=True, exist_ok=True)
                    result = await run_once(run, frontend, run_dir, taps, record_dir)
                    sections = []
                    if run.kind == "multi-turn":
                        await add_reuse(result, record_dir, run_dir)
                        sections.append(format_reuse(result))
                    text = format_table(result, sections)
                by_number[number] = result
                results.append(result)
                print(text, file=out, flush=True)
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
    if any(isinstance(r, ReplayPlan) or r.kind == "multi-turn" for r in runs):
        missing = missing_tools()
        if missing:
            print(
                f"demo: the multi-turn and replay runs {missing}; or pass --runs reference",
                file=sys.stderr,
            )
            return 2
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="shadow-proxy-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    out_dir = out_dir.resolve()
    services: dict[str, int] = {}
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = asyncio.run(run_all(args, runs, out, out_dir, services))
    except (DemoError, ChildExited, WaitTimeout, NatsServerUnavailable) as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    services_ok = all(status == 0 for status in services.values())
    ok = all(r["ok"] for r in results) and services_ok
    elapsed = time.monotonic() - started
    stopped = ", ".join(f"{name} {status}" for name, status in services.items())
    if len(results) > 1:
        passed = sum(r["ok"] for r in results)
        print(f"\n{passed}/{len(results)} runs OK in {elapsed:.1f} s", file=out)
    if stopped:
        verdict = "" if services_ok else " (FAILED: every process must exit with status 0)"
        print(f"exit status of the demo's services: {stopped}{verdict}", file=out)
    print(f"records and reports: {out_dir}", file=out)
    if args.json:
        document = {
            "ok": ok,
            "elapsed_s": round(elapsed, 2),
            "transport": args.transport,
            "out": str(out_dir),
            "services": services,
            "runs": results,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0 if ok else 1
