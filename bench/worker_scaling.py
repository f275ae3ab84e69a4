"""The ``scaling`` regime: worker throughput on 2k-token prompts with 1 core (one
shard, the proxy pinned to core 1) against 2 cores (two shards). The worker is
stopped (SIGSTOP) while the requests are sent, so they wait in the hand-off; then
it is resumed and timed until every record is published: nothing else runs
meanwhile. Target: 2 cores >= 1.8x the throughput of 1."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.cases import evolved
from bench.procfs import cpu_seconds
from bench.scrape import listing, worker_pids
from bench.services import MODEL_NAME, PROXY_CPU, Frontend, start_proxy
from shadow_proxy.devtools.loadgen import LoadSpec, run_load


async def scaling(kind: str, args, scratch: Path) -> dict[str, Any]:
    requests = args.requests or 2000
    isl = args.isl or 2048
    frontend = await Frontend.start(kind, scratch, pace=None, speedup=1000.0, cpus=None)
    runs: dict[str, list[dict[str, float]]] = {"1 core": [], "2 cores": []}
    try:
        for rnd in range(args.rounds):
            order = list(runs) if rnd % 2 == 0 else list(reversed(runs))
            for case in order:
                one = case == "1 core"
                worker = {"processes": 1 if one else 2, "max_lag_s": None}
                service, url, main, _ = await start_proxy(
                    frontend.url, scratch, True, PROXY_CPU if one else None, worker
                )
                try:
                    spec = LoadSpec(
                        url=url,
                        model=MODEL_NAME,
                        requests=requests,
                        concurrency=32,
                        prompt_tokens=isl,
                        output_tokens=4,
                        seed=rnd,
                    )
                    await run_load(evolved(spec, requests=20, seed=999))
                    runs[case].append(await _drain(url, main, spec))
                    rate = runs[case][-1]["records_per_s"]
                    print(f"[scaling] round {rnd + 1} {case}: {rate:.1f} records/s", flush=True)
                finally:
                    service.terminate()
    finally:
        frontend.stop()
    summary = {case: _median_run(r) for case, r in runs.items()}
    ratio = summary["2 cores"]["records_per_s"] / max(1e-9, summary["1 core"]["records_per_s"])
    return {
        "regime": "scaling",
        "frontend": frontend.label,
        "isl": isl,
        "requests": requests,
        "rounds": args.rounds,
        "cases": summary,
        "runs": runs,
        "targets": [("2 cores / 1 core throughput >= 1.8", ratio, 1.8, True)],
    }


async def _drain(url: str, main: int, spec: LoadSpec) -> dict[str, float]:
    """Stop the worker, send the requests, resume it: records/s and CPU per record."""
    taps = listing(url)
    start = {t["name"]: t["next_seq"] for t in taps}
    pids = worker_pids(main)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        report = await run_load(spec)
    finally:
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        t0 = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    sent = sum(1 for r in report.results if r.ok)
    await published(url, start, sent)
    elapsed = time.monotonic() - t0
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
    return {
        "records": sent,
        "seconds": elapsed,
        "records_per_s": sent / elapsed,
        "worker_cpu_ms_per_record": 1000 * cpu / max(1, sent),
    }


async def published(url: str, start: dict[str, int], sent: int, timeout: float = 600) -> None:
    """Until every tap has published ``sent`` records since ``start`` (its ``next_seq``
    then): the worker's CPU is read after its backlog, not in the middle of it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(t["next_seq"] - start[t["name"]] >= sent for t in listing(url)):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the taps did not publish {sent} records in {timeout:.0f} s")


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    ordered = sorted(runs, key=lambda r: r["records_per_s"])
    return ordered[len(ordered) // 2]
