"""The tap worker's regimes of the cost benchmark (issue 19), run by ``bench/proxy_bench.py``.

- ``scaling``: worker throughput on 2k-token prompts with 1 core (one shard, the
  proxy pinned to core 1) against 2 cores (two shards). The worker is stopped
  (SIGSTOP) while the requests are sent, so they wait in the hand-off; then it
  is resumed and timed until every record is published: nothing else runs
  meanwhile. Target: 2 cores >= 1.8x the throughput of 1.
- ``multiturn``: conversations of 10 to 30 turns growing to 8k-32k tokens,
  interleaved like agent traffic; the worker's CPU per request (main and shards)
  with incremental tokenization against a full re-encode
  (``worker.tokenizer_cache_bytes: 0``), and against the frontend's own CPU per
  request (run it with ``--frontend dynamo``). Targets: <= 0.3x the full
  re-encode, <= 0.5x the frontend; the prompt-token mismatch metric stays 0.
- ``overload``: long prompts at a rate the worker, pinned with the proxy to
  one core, cannot follow: record lag p99 stays under ``worker.max_lag_s``
  (requests past it are dropped as ``late`` and counted), and the clients'
  latency does not move (two taps against none).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from bench import proxy_bench as pb
from shadow_proxy.devtools.loadgen import LoadSpec, make_prompt, run_load

HISTOGRAM = re.compile(r'^(\w+)_bucket\{(.*?)le="([^"]+)"(.*?)\} (\S+)$', re.M)


def metrics(url: str) -> str:
    return pb.get_text(url + "/metrics")


def counter(text: str, name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def buckets(text: str, name: str, **labels: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for family, before, le, after, value in HISTOGRAM.findall(text):
        if family == name and all(f'{k}="{v}"' in before + after for k, v in labels.items()):
            out[float(le)] = out.get(float(le), 0.0) + float(value)
    return out


def listing(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/shadow/taps", timeout=10) as r:
        return json.loads(r.read())["taps"]


def worker_pids(main: int) -> list[int]:
    return [main, *pb.children(main)]


# --------------------------------------------------------------------------- scaling


async def scaling(kind: str, args, scratch: Path) -> dict[str, Any]:
    requests = args.requests or 2000
    isl = args.isl or 2048
    frontend = await pb.Frontend.start(kind, scratch, pace=None, speedup=1000.0, cpus=None)
    runs: dict[str, list[dict[str, float]]] = {"1 core": [], "2 cores": []}
    try:
        for rnd in range(args.rounds):
            order = list(runs) if rnd % 2 == 0 else list(reversed(runs))
            for case in order:
                one = case == "1 core"
                worker = {"processes": 1 if one else 2, "max_lag_s": None}
                service, url, main, _ = await pb.start_proxy(
                    frontend.url, scratch, True, pb.PROXY_CPU if one else None, worker
                )
                try:
                    spec = LoadSpec(url=url, model=pb.MODEL_NAME, requests=requests,
                                    concurrency=32, prompt_tokens=isl, output_tokens=4,
                                    seed=rnd)  # fmt: skip
                    await run_load(pb._with(spec, requests=20, seed=999))
                    runs[case].append(await _drain(url, main, spec))
                    rate = runs[case][-1]["records_per_s"]
                    print(f"[scaling] round {rnd + 1} {case}: {rate:.1f} records/s", flush=True)
                finally:
                    service.terminate()
    finally:
        frontend.stop()
    summary = {case: _median_run(r) for case, r in runs.items()}
    ratio = summary["2 cores"]["records_per_s"] / max(1e-9, summary["1 core"]["records_per_s"])
    return {"regime": "scaling", "frontend": frontend.label, "isl": isl, "requests": requests,
            "rounds": args.rounds, "cases": summary, "runs": runs,
            "targets": [("2 cores / 1 core throughput >= 1.8", ratio, 1.8, True)]}  # fmt: skip


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
        cpu0 = sum(pb.cpu_seconds(pid) for pid in pids)
        t0 = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    sent = sum(1 for r in report.results if r.ok)
    deadline = t0 + 600
    while time.monotonic() < deadline:
        done = all(t["next_seq"] - start[t["name"]] >= sent for t in listing(url))
        if done:
            break
        await asyncio.sleep(0.05)
    elapsed = time.monotonic() - t0
    cpu = sum(pb.cpu_seconds(pid) for pid in pids) - cpu0
    return {"records": sent, "seconds": elapsed, "records_per_s": sent / elapsed,
            "worker_cpu_ms_per_record": 1000 * cpu / max(1, sent)}  # fmt: skip


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    ordered = sorted(runs, key=lambda r: r["records_per_s"])
    return ordered[len(ordered) // 2]


# --------------------------------------------------------------------------- multiturn


def conversations(n: int, seed: int) -> list[list[dict[str, Any]]]:
    """Each conversation as its requests: 10-30 turns, growing to 8k-32k tokens
    (words of the load generator: about a token each)."""
    rng = random.Random(seed)
    out = []
    for c in range(n):
        turns = rng.randint(10, 30)
        final = rng.randint(8_000, 30_000)
        per_turn = (final - 1_000) // turns
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"Agent {c}. " + make_prompt(rng, 1_000)}
        ]
        requests = []
        for _ in range(turns):
            messages.append({"role": "user", "content": make_prompt(rng, per_turn // 3)})
            requests.append([dict(m) for m in messages])
            reply = make_prompt(rng, 2 * per_turn // 3)
            messages.append({"role": "assistant", "content": reply})
        out.append(requests)
    return out


async def _converse(url: str, talks: list[list[list[dict]]], concurrency: int) -> int:
    """Each conversation turn by turn, ``concurrency`` conversations at a time."""
    sem = asyncio.Semaphore(concurrency)
    sent = 0

    async def talk(requests: list[list[dict]]) -> None:
        nonlocal sent
        async with sem, aiohttp.ClientSession() as session:
            for messages in requests:
                body = {"model": pb.MODEL_NAME, "messages": messages, "max_tokens": 8,
                        "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
                async with session.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    sent += r.status == 200

    await asyncio.gather(*(talk(t) for t in talks))
    return sent


async def multiturn(kind: str, args, scratch: Path) -> dict[str, Any]:
    n = args.conversations
    frontend = await pb.Frontend.start(kind, scratch, pace=None, speedup=1000.0, cpus=None)
    cases = {"incremental": {}, "full re-encode": {"tokenizer_cache_bytes": 0}}
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    try:
        for rnd in range(args.rounds):
            order = list(cases) if rnd % 2 == 0 else list(reversed(cases))
            for case in order:
                # Conversations of their own per case: no cache of the frontend's
                # (or a prefix cache) carries over from the other case.
                talks = conversations(n, seed=100 * rnd + list(cases).index(case))
                worker = {"max_lag_s": None, **cases[case]}
                if args.processes:
                    worker["processes"] = args.processes
                service, url, main, _ = await pb.start_proxy(
                    frontend.url, scratch, True, None, worker
                )
                try:
                    pids = {
                        "worker": worker_pids(main),
                        **{r: [p] for r, p in frontend.pids.items()},
                    }
                    before = _cpu(pids)
                    sent = await _converse(url, talks, args.concurrency or 8)
                    await asyncio.sleep(2.0)  # the last records, a metrics snapshot
                    after = _cpu(pids)
                    text = metrics(url)
                finally:
                    service.terminate()
                run = {f"{role}_cpu_ms_per_request": 1000 * (after[role] - before[role]) / sent
                       for role in before}  # fmt: skip
                run["requests"] = sent
                run["mismatches"] = counter(text, "shadow_prompt_token_mismatches_total")
                encoded = counter(text, "shadow_tokenizer_tokens_total", source="encoded")
                reused = counter(text, "shadow_tokenizer_tokens_total", source="reused")
                run["tokens_encoded_fraction"] = (
                    encoded / (encoded + reused) if encoded + reused else None
                )
                runs[case].append(run)
                print(f"[multiturn] round {rnd + 1} {case}: {run}", flush=True)
    finally:
        frontend.stop()
    summary = {c: _median(r) for c, r in runs.items()}
    inc, full = summary["incremental"], summary["full re-encode"]
    targets = [
        ("incremental / full re-encode worker CPU per request <= 0.3",
         inc["worker_cpu_ms_per_request"] / max(1e-9, full["worker_cpu_ms_per_request"]), 0.3,
         False),
        ("incremental worker CPU / frontend CPU per request <= 0.5",
         inc["worker_cpu_ms_per_request"] / max(1e-9, inc["frontend_cpu_ms_per_request"]), 0.5,
         False),
        ("prompt-token mismatches == 0", inc["mismatches"] + full["mismatches"], 0, False),
    ]  # fmt: skip
    return {"regime": "multiturn", "frontend": frontend.label, "conversations": n,
            "rounds": args.rounds, "cases": summary, "runs": runs, "targets": targets}  # fmt: skip


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    return {role: sum(pb.cpu_seconds(pid) for pid in group) for role, group in pids.items()}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for key in runs[0]:
        values = sorted(r[key] for r in runs if r[key] is not None)
        out[key] = values[len(values) // 2] if values else None
    return out


# --------------------------------------------------------------------------- overload


async def overload(kind: str, args, scratch: Path) -> dict[str, Any]:
    requests = args.requests or 3000
    concurrency = args.concurrency or 64
    max_lag = args.max_lag_s
    os.sched_setaffinity(0, {int(pb.OTHER_CPU)})
    pace = (args.ttft_ms, args.itl_ms)
    frontend = await pb.Frontend.start(
        kind, scratch, pace=pace, speedup=args.speedup, cpus=pb.OTHER_CPU
    )
    worker = {"processes": 1, "max_lag_s": max_lag}
    base = LoadSpec(url="", model=pb.MODEL_NAME, requests=requests, concurrency=concurrency,
                    prompt_tokens=args.isl or 8192, output_tokens=args.osl or 16)  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"proxy": [], "taps": []}
    try:
        for rnd in range(args.rounds):
            for case in list(runs) if rnd % 2 == 0 else list(reversed(runs)):
                spec = pb._with(base, seed=rnd)
                warmup = pb._with(base, seed=rnd + 500, requests=args.warmup,
                                  concurrency=min(concurrency, args.warmup))  # fmt: skip
                run = await pb.run_case(case, frontend, scratch, args, spec, warmup, True, worker,
                                        settle_s=max_lag + 1)  # fmt: skip
                runs[case].append(run)
                print(f"[overload] round {rnd + 1} {case}: {run['report'].summary()}", flush=True)
    finally:
        frontend.stop()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    cases = {c: pb.aggregate(r) for c, r in runs.items()}
    lag: dict[str, Any] = {}
    for tap in pb.TAP_NAMES:
        merged: dict[float, float] = {}
        late = 0.0
        for run in runs["taps"]:
            for le, value in buckets(run["metrics"], "shadow_tap_record_lag_seconds",
                                     tap=tap).items():  # fmt: skip
                merged[le] = merged.get(le, 0.0) + value
            late += counter(run["metrics"], "shadow_tap_dropped_total", tap=tap, reason="late")
        p99 = pb.histogram_quantile({}, merged, 0.99)
        lag[tap] = {"lag_p99_s": p99, "published": merged.get(float("inf"), 0.0), "late": late}
    targets = [(f"{tap}: record lag p99 < max_lag_s ({max_lag:g} s)", v["lag_p99_s"], max_lag,
                False) for tap, v in lag.items()]  # fmt: skip
    p, t = cases["proxy"], cases["taps"]
    targets += [
        ("taps: TTFT p50 / no taps <= 1.05", t["ttft_p50_ms"] / p["ttft_p50_ms"], 1.05, False),
        ("taps: TTFT p99 / no taps <= 1.10", t["ttft_p99_ms"] / p["ttft_p99_ms"], 1.10, False),
        ("taps: req/s / no taps >= 0.95", t["requests_per_s"] / p["requests_per_s"], 0.95, True),
    ]
    return {"regime": "overload", "frontend": frontend.label, "requests": requests,
            "concurrency": concurrency, "rounds": args.rounds, "max_lag_s": max_lag,
            "cases": cases, "lag": lag, "targets": targets}  # fmt: skip


# --------------------------------------------------------------------------- entry, output


async def run(regime: str, kind: str, args, scratch: Path) -> dict[str, Any]:
    return await {"scaling": scaling, "multiturn": multiturn, "overload": overload}[regime](
        kind, args, scratch
    )


def markdown(result: dict[str, Any], command: str) -> str:
    m = result["machine"]
    out = [f"## shadow-proxy bench: {result['regime']} ({result['started']})", "",
           f"Command: `{command}`  ",
           f"Machine: {m['cpu_model']}, {m['cores']} cores, load average at start "
           f"{m['loadavg_at_start']}", ""]  # fmt: skip
    for part in result["parts"]:
        out.append(f"### {part['regime']}: {part['frontend']}")
        out.append("")
        out.append("| case | " + " | ".join(_keys(part["cases"])) + " |")
        out.append("|---|" + "---:|" * len(_keys(part["cases"])))
        for name, values in part["cases"].items():
            cells = [_cell(values.get(k)) for k in _keys(part["cases"])]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
        if part.get("lag"):
            out.append("| tap | record lag p99 s | published | dropped late |")
            out.append("|---|---:|---:|---:|")
            for tap, v in part["lag"].items():
                out.append(f"| {tap} | {_cell(v['lag_p99_s'])} | {_cell(v['published'])} | "
                           f"{_cell(v['late'])} |")  # fmt: skip
            out.append("")
        out.append("| target | measured | met |")
        out.append("|---|---:|---|")
        for label, value, bound, at_least in part["targets"]:
            met = value is not None and (value >= bound if at_least else value <= bound)
            out.append(f"| {label} | {_cell(value)} | {'yes' if met else '**no**'} |")
        out.append("")
    return "\n".join(out) + "\n"


def _keys(cases: dict[str, dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for values in cases.values():
        keys += [k for k, v in values.items() if isinstance(v, int | float) and k not in keys]
    return keys


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)
