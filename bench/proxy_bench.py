"""The cost benchmark: what a client pays for going through shadow-proxy.

``make bench`` (or ``shadow-proxy bench``) runs it; ``--help`` lists the options.
Not part of the tests. Every figure is compared as a ratio within one run:
the cases of a regime run in alternating rounds (the order rotated each round)
against one frontend, so a noisy machine affects them alike.

Cases:

1. ``direct``: clients straight to the frontend;
2. ``nginx``: through nginx (Debian's package, ``worker_processes 1``, SSE
   pass-through with ``proxy_buffering off`` and upstream keep-alive): a C
   reference for what any reverse proxy costs;
3. ``proxy``: shadow-proxy without taps;
4. ``taps``: shadow-proxy with the two reference taps and a consumer reading each
   (at nice 19: consumers run elsewhere in a deployment);
5. ``taps-stalled``: the same with both consumers stopped by SIGSTOP.

Regimes:

- ``quick``: issue 2's direct vs proxy at concurrency 1 and 64 (about a minute);
- ``capacity``: the frontend at full speed, concurrency 64: requests/s, TTFT,
  CPU seconds per 1,000 requests of each process (``/proc/PID/stat``,
  utime+stime, children excluded), RSS, records and gaps per tap;
- ``isolation``: the frontend paced like an engine, below saturation, the proxy
  (or nginx) and its tap worker pinned to core 1 with ``taskset``, the rest to
  core 0: TTFT and end-to-end latency, requests/s, the serving loop's lag
  (``SHADOW_PROXY_LOOP_LAG=1``, histogram ``shadow_proxy_loop_lag_seconds``);
- ``memory``: many requests with both consumers stopped versus reading: the
  proxy's and the worker's peak RSS;
- ``isolation-dynamo``: the real Dynamo frontend near saturation (mocker
  ``--speedup-ratio 10``, ~700-word prompts, 32 output tokens, concurrency 24),
  the proxy and its tap worker pinned to core 1, Dynamo, load and consumers to
  core 0; no taps vs two taps (consumers reading, stopped), quiet and with a
  CPU-bound neighbour process on the proxy's core;
- ``quick-ack``: the same setting, the proxy (no taps) with and without its
  quick ACK per response (``upstream.quick_ack``), against Dynamo direct;
- ``scaling``, ``multiturn``, ``overload``, ``hostile``: the tap worker's own
  regimes (``bench/worker_bench.py``): throughput on 1 vs 2 cores, CPU per
  request on growing conversations against a full re-encode and the frontend's
  own, record lag and client latency when the worker cannot follow, and the
  worker's memory and other clients' latency beside hostile bodies.

The tap worker's CPU and RSS are its main's and its shards' together.

``--profile`` adds one unmeasured run of the ``taps`` case with py-spy
attached to the serving process and to the tap worker, and reports their top
functions. Results go to ``bench/results/<timestamp>-<regime>.{json,md}`` (and
``-ttft.png`` for ``hostile``) and ``bench/results/latest.md`` (the newest run's
tables; untracked, in .gitignore: a run never rewrites a committed file; commit
the timestamped files you mean to keep).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cases import (
    CASE_TITLES,
    CASES,
    NEIGHBOUR_CASES,
    aggregate,
    evolved,
    run_case,
    run_json,
)
from bench.profile import profile_case
from bench.services import MODEL_DIR, MODEL_NAME, OTHER_CPU, PROXY_CPU, REPO, RESULTS, Frontend
from bench.tables import machine, markdown
from shadow_proxy.devtools.loadgen import LoadSpec


async def run_regime(regime: str, frontend_kind: str, args, scratch: Path) -> dict[str, Any]:
    isolate = regime in ("isolation", "isolation-dynamo", "quick-ack")
    if regime in ("isolation-dynamo", "quick-ack"):
        frontend_kind = "dynamo"
        cases = ("direct", "proxy", "taps", "taps-stalled", *NEIGHBOUR_CASES)
        if regime == "quick-ack":  # the quick ACK on and off, in the same setting
            cases = ("direct", "proxy", "proxy-no-quick-ack")
        loads = [(args.concurrency or 24, args.requests or 1200)]
        args.isl, args.osl = args.isl or 700, args.osl or 32
    elif regime == "quick":
        cases = ("direct", "proxy")
        loads = [
            (c, args.quick_requests if c > 1 else max(50, args.quick_requests // 3))
            for c in (1, 64)
        ]
    elif regime == "memory":
        cases = ("taps", "taps-stalled")
        loads = [(args.concurrency or 64, args.requests or 12000)]
    elif regime == "isolation":
        cases = CASES
        loads = [(args.concurrency or 16, args.requests or 1200)]
    else:
        cases = CASES
        loads = [(args.concurrency or 64, args.requests or 3000)]
    args.isl, args.osl = args.isl or 2048, args.osl or 16
    pace = (args.ttft_ms, args.itl_ms) if isolate else None
    speedup = args.speedup if isolate else 1000.0
    if isolate:
        os.sched_setaffinity(0, {int(OTHER_CPU)})
    frontend = await Frontend.start(
        frontend_kind, scratch, pace=pace, speedup=speedup, cpus=OTHER_CPU if isolate else None
    )
    tables = []
    try:
        for concurrency, requests in loads:
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
            base = LoadSpec(
                url="",
                model=MODEL_NAME,
                requests=requests,
                concurrency=concurrency,
                prompt_tokens=args.isl,
                output_tokens=args.osl,
                stream=True,
            )
            for rnd in range(args.rounds):
                order = cases[rnd % len(cases) :] + cases[: rnd % len(cases)]
                for i, case in enumerate(order):
                    seed = 1000 * (rnd + 1) + 10 * list(CASE_TITLES).index(case) + concurrency
                    spec = evolved(base, seed=seed)
                    warmup = evolved(
                        base,
                        seed=seed + 500_000,
                        requests=args.warmup,
                        concurrency=min(concurrency, args.warmup),
                    )
                    t0 = time.monotonic()
                    run = await run_case(case, frontend, scratch, args, spec, warmup, isolate)
                    s = run["report"].summary()
                    print(
                        f"[{regime}/{frontend_kind} c={concurrency}] round {rnd + 1} "
                        f"#{i + 1} {case}: {s['requests_per_s']:.1f} req/s, ttft p50 "
                        f"{s['ttft_p50_ms']} p99 {s['ttft_p99_ms']} ms, errors {s['errors']}, "
                        f"cpu {_fmt_cpu(run['cpu_s'])} ({time.monotonic() - t0:.0f}s)",
                        flush=True,
                    )
                    runs[case].append(run)
            tables.append(
                {
                    "concurrency": concurrency,
                    "requests": requests,
                    "cases": {c: aggregate(runs[c]) for c in cases},
                    "runs": {c: [run_json(r) for r in runs[c]] for c in cases},
                }
            )
        profile = None
        if args.profile and regime in ("capacity", "isolation"):
            concurrency, requests = loads[0]
            spec = LoadSpec(
                url="",
                model=MODEL_NAME,
                requests=requests,
                concurrency=concurrency,
                prompt_tokens=args.isl,
                output_tokens=args.osl,
                seed=99,
            )
            profile = await profile_case(frontend, scratch, spec, isolate)
    finally:
        frontend.stop()
        if isolate:
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return {
        "regime": regime,
        "frontend": frontend.label,
        "frontend_kind": frontend_kind,
        "isl": args.isl,
        "osl": args.osl,
        "rounds": args.rounds,
        "warmup_requests": args.warmup,
        "pinned": {"proxy_and_worker": PROXY_CPU, "others": OTHER_CPU} if isolate else None,
        "tables": tables,
        "profile": profile,
    }


def _fmt_cpu(cpu: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.1f}s" for k, v in cpu.items())


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shadow-proxy bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--regime",
        default="quick",
        choices=(
            "capacity",
            "isolation",
            "memory",
            "quick",
            "isolation-dynamo",
            "quick-ack",
            *WORKER_REGIMES,
            "all",
        ),
    )
    parser.add_argument(
        "--frontend",
        default="builtin",
        choices=("builtin", "dynamo", "vllm", "both"),
        help="vllm: multiturn only (vLLM 0.32 on the CPU, make vllm)",
    )
    parser.add_argument("--requests", type=int, help="per case and round (default per regime)")
    parser.add_argument("--concurrency", type=int, help="default: 64, isolation 16")
    parser.add_argument("--rounds", type=int, help="per case (default 2; hostile 4: see ROUNDS)")
    parser.add_argument(
        "--isl", type=int, help="prompt tokens (default 2048; isolation-dynamo 700 words)"
    )
    parser.add_argument("--osl", type=int, help="output tokens (default 16; isolation-dynamo 32)")
    parser.add_argument("--warmup", type=int, default=100, help="requests per case and round")
    parser.add_argument(
        "--quick-requests",
        type=int,
        default=600,
        help="quick regime: at concurrency 64 (a third of it at 1)",
    )
    parser.add_argument("--ttft-ms", type=float, default=50.0, help="isolation: frontend pacing")
    parser.add_argument("--itl-ms", type=float, default=10.0, help="isolation: frontend pacing")
    parser.add_argument(
        "--speedup", type=float, default=10.0, help="isolation with Dynamo: mocker --speedup-ratio"
    )
    parser.add_argument(
        "--answers",
        choices=("synthetic", "frontend", "words"),
        default="synthetic",
        help="multiturn: resend the bench's answers (8 tokens asked "
        "for), or ask for as many and resend the frontend's (random token ids from "
        "Dynamo's mocker), or (words, Dynamo only) have the mocker stream the bench's "
        "English answer (from an output-replay trace) and resend that",
    )
    parser.add_argument(
        "--dynamo-tokenizer-cache",
        choices=("on", "off"),
        default="on",
        help="multiturn: Dynamo's own tokenizer prefix cache (off: "
        "DYN_TOKENIZER_CACHE=0, every prompt encoded in full)",
    )
    parser.add_argument(
        "--conversations", type=int, default=24, help="multiturn: conversations per case and round"
    )
    parser.add_argument(
        "--new-frontend-each-round",
        action="store_true",
        help="multiturn: start the frontend (and its engine) anew for each round, so that "
        "every round measures a frontend that has served only that round",
    )
    parser.add_argument(
        "--processes", type=int, help="multiturn: worker.processes (default: one per core)"
    )
    parser.add_argument(
        "--worker-malloc",
        help="multiturn: worker.malloc (default auto: jemalloc when the machine has it; "
        "system: the C library's malloc)",
    )
    parser.add_argument(
        "--conversation-size",
        choices=("long", "short"),
        help="multiturn: long (10-30 turns to 8k-30k tokens; the default) or short "
        "(4-6 turns to 1.2k-2k words, within vLLM's 4,096; the default with --frontend vllm)",
    )
    parser.add_argument("--max-lag-s", type=float, default=5.0, help="overload: worker.max_lag_s")
    parser.add_argument(
        "--hostile",
        nargs="*",
        default=[],
        metavar="KIND",
        help="hostile: send only these (62, 7, 256: the tools body, the "
        "long prompt, the gzip bomb); default all",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the serving process and worker (capacity, isolation)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    return parser


#: The tap worker's regimes, run by ``bench/worker_bench.py``.
WORKER_REGIMES = ("scaling", "multiturn", "overload", "hostile")

#: Rounds per case where the default 2 is too few: beside hostile traffic both
#: cases' TTFT p99 lies in the half second after each 62 MB upload, whose depth
#: varies from round to round by more than the 10% bound (docs/benchmarks.md, the misses).
ROUNDS = {"hostile": 4}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not MODEL_DIR.joinpath("tokenizer.json").exists():
        from shadow_proxy.devtools import modeldirs

        modeldirs.build_all(REPO / ".models")
    regimes = (
        ("quick", "capacity", "isolation", "memory") if args.regime == "all" else (args.regime,)
    )
    frontends = ("builtin", "dynamo") if args.frontend == "both" else (args.frontend,)
    if "vllm" in frontends and args.regime != "multiturn":
        print("proxy_bench: --frontend vllm is for --regime multiturn", file=sys.stderr)
        return 2
    command = "make bench BENCH_ARGS='" + " ".join(argv if argv is not None else sys.argv[1:]) + "'"
    args.output.mkdir(parents=True, exist_ok=True)
    info = machine()
    for regime in regimes:
        started = time.strftime("%Y%m%d-%H%M%S")
        parts = []
        kinds = ("dynamo",) if regime in ("isolation-dynamo", "quick-ack") else frontends
        with tempfile.TemporaryDirectory(prefix="shadow-bench-") as tmp:
            for kind in kinds:
                if (
                    regime in ("quick", "memory", "isolation")
                    and kind == "dynamo"
                    and len(frontends) > 1
                ):
                    continue  # built-in only unless asked for Dynamo alone
                scratch = Path(tmp) / kind
                scratch.mkdir()
                # A copy of the options: a regime fills in its own defaults.
                options = argparse.Namespace(**vars(args))
                options.rounds = args.rounds or ROUNDS.get(regime, 2)
                if regime in WORKER_REGIMES:
                    from bench import worker_bench

                    parts.append(asyncio.run(worker_bench.run(regime, kind, options, scratch)))
                else:
                    parts.append(asyncio.run(run_regime(regime, kind, options, scratch)))
        result = {
            "regime": regime,
            "started": started,
            "command": command,
            "machine": info,
            "parts": parts,
        }
        stem = args.output / f"{started}-{regime}"
        if regime in WORKER_REGIMES:
            from bench import plots, worker_bench

            for i, part in enumerate(parts):
                data = part.pop(worker_bench.PLOT, None)
                if data:
                    png = stem.parent / f"{stem.name}-ttft{f'-{i}' if i else ''}.png"
                    title = f"{regime}: {part['frontend']}"
                    part["plot"] = plots.ttft(png, data, command, title).name
            text = worker_bench.markdown(result, command)
        else:
            text = markdown(result, command)
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        stem.with_suffix(".md").write_text(text)
        latest = args.output / "latest.md"
        previous = latest.read_text() if latest.exists() and len(regimes) > 1 else ""
        latest.write_text(previous + text if regime != regimes[0] else text)
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
