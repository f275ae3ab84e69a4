"""The ``overload`` regime: long prompts at a rate the worker cannot follow; record
lag p99 stays under ``worker.max_lag_s`` and the clients' latency does not move."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.cases import aggregate, evolved, histogram_quantile, run_case
from bench.scrape import buckets, counter
from bench.services import MODEL_NAME, OTHER_CPU, Frontend
from shadow_proxy.devtools.loadgen import LoadSpec
from shadow_proxy.devtools.reference_taps import TAP_NAMES


async def overload(kind: str, args, scratch: Path) -> dict[str, Any]:
    requests = args.requests or 3000
    concurrency = args.concurrency or 64
    max_lag = args.max_lag_s
    os.sched_setaffinity(0, {int(OTHER_CPU)})
    pace = (args.ttft_ms, args.itl_ms)
    frontend = await Frontend.start(kind, scratch, pace=pace, speedup=args.speedup, cpus=OTHER_CPU)
    worker = {"processes": 1, "max_lag_s": max_lag}
    base = LoadSpec(
        url="",
        model=MODEL_NAME,
        requests=requests,
        concurrency=concurrency,
        prompt_tokens=args.isl or 8192,
        output_tokens=args.osl or 16,
    )
    runs: dict[str, list[dict[str, Any]]] = {"proxy": [], "taps": []}
    try:
        for rnd in range(args.rounds):
            for case in list(runs) if rnd % 2 == 0 else list(reversed(runs)):
                spec = evolved(base, seed=rnd)
                warmup = evolved(
                    base,
                    seed=rnd + 500,
                    requests=args.warmup,
                    concurrency=min(concurrency, args.warmup),
                )
                run = await run_case(
                    case, frontend, scratch, args, spec, warmup, True, worker, settle_s=max_lag + 1
                )
                runs[case].append(run)
                print(f"[overload] round {rnd + 1} {case}: {run['report'].summary()}", flush=True)
    finally:
        frontend.stop()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    cases = {c: aggregate(r) for c, r in runs.items()}
    lag: dict[str, Any] = {}
    for tap in TAP_NAMES:
        merged: dict[float, float] = {}
        late = 0.0
        for run in runs["taps"]:
            for le, value in buckets(
                run["metrics"], "shadow_tap_record_lag_seconds", tap=tap
            ).items():
                merged[le] = merged.get(le, 0.0) + value
            late += counter(run["metrics"], "shadow_tap_dropped_total", tap=tap, reason="late")
        p99 = histogram_quantile({}, merged, 0.99)
        lag[tap] = {"lag_p99_s": p99, "published": merged.get(float("inf"), 0.0), "late": late}
    targets = [
        (f"{tap}: record lag p99 < max_lag_s ({max_lag:g} s)", v["lag_p99_s"], max_lag, False)
        for tap, v in lag.items()
    ]
    p, t = cases["proxy"], cases["taps"]
    targets += [
        ("taps: TTFT p50 / no taps <= 1.05", t["ttft_p50_ms"] / p["ttft_p50_ms"], 1.05, False),
        ("taps: TTFT p99 / no taps <= 1.10", t["ttft_p99_ms"] / p["ttft_p99_ms"], 1.10, False),
        ("taps: req/s / no taps >= 0.95", t["requests_per_s"] / p["requests_per_s"], 0.95, True),
    ]
    return {
        "regime": "overload",
        "frontend": frontend.label,
        "requests": requests,
        "concurrency": concurrency,
        "rounds": args.rounds,
        "max_lag_s": max_lag,
        "cases": cases,
        "lag": lag,
        "targets": targets,
    }
