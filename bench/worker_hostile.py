"""The ``hostile`` regime (see ``worker_bench.py``): a paced load beside a stream
of hostile requests, one a second; the worker's peak RSS, the other clients'
latency and their records' lag."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.cases import Side, aggregate, evolved, histogram_quantile, run_case
from bench.scrape import buckets, counter, listing
from bench.services import MODEL_NAME, REPO, Frontend
from shadow_proxy.devtools.loadgen import LoadSpec, make_prompt, many_tools
from shadow_proxy.devtools.reference_taps import TAP_NAMES

#: The worker's memory bound the regime holds it to (docs/metrics.md, Bounds): each shard is
#: replaced past ``max_rss_mb``; the main holds its hand-off share besides.
MAX_RSS_MB = 1024
MAIN_ALLOWANCE_MB = 512


#: One hostile request a second (about 1% of the measured load): the regime shows
#: what one hostile request costs the others, not the overload regime again.
HOSTILE_INTERVAL_S = 1.0


def hostile_requests(kinds: list[str] | None = None) -> list[tuple[str, bytes, dict[str, str]]]:
    """(kind, body, headers) of each hostile request, in the order they are sent;
    ``kinds``: the first word of each kind to build (all when empty)."""
    bomb = {
        "model": MODEL_NAME,
        "stream": True,
        "messages": [{"role": "user", "content": "a bomb, please"}],
    }
    rejected = {"x-mock-fault": "status=400"}
    bombing = {"x-mock-fault": "gzip-bomb=256", "Accept-Encoding": "gzip"}

    def long_prompt() -> bytes:
        content = make_prompt(random.Random(18), 1_200_000)[: 7 << 20]
        messages = [{"role": "user", "content": content}]
        return json.dumps({"model": MODEL_NAME, "stream": True, "messages": messages}).encode()

    builders = [
        ("62 MB of tools", lambda: many_tools(MODEL_NAME, 600, 1000), rejected),
        # max_tokens 4: read for 272 events (worker/budget.py, response_events).
        ("256 MiB gzip bomb", lambda: json.dumps({**bomb, "max_tokens": 4}).encode(), bombing),
        ("7 MiB prompt", long_prompt, rejected),
        # No max_tokens: 131k events by the context length, or the CPU budget.
        ("256 MiB gzip bomb, no max_tokens", lambda: json.dumps(bomb).encode(), bombing),
    ]
    return [
        (kind, build(), headers)
        for kind, build, headers in builders
        if not kinds or kind.split()[0] in kinds
    ]


#: What the hostile sender prints once its bodies are built and it starts sending.
READY = b"sending\n"


def hostile_traffic(kinds: list[str]) -> Side:
    """Run ``python -m bench.worker_hostile URL`` (the hostile sender, a process of its
    own so that the load generator's loop measures undisturbed); ``ready`` once it
    has built its bodies and starts sending, until told to stop; then wait until the
    worker has published or dropped everything (its taps' seqs still for 12 s) and
    return what each hostile kind got back."""

    async def side(url: str, ready: asyncio.Event, stop: asyncio.Event) -> dict[str, Any]:
        sender = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.worker_hostile",
            url,
            *kinds,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO,
        )
        try:
            assert sender.stdout is not None
            if await sender.stdout.readline() != READY:
                raise RuntimeError("the hostile sender ended before sending")
            ready.set()
            await stop.wait()
            sender.send_signal(signal.SIGTERM)
            out, _ = await sender.communicate()
        finally:
            if sender.returncode is None:
                sender.kill()
                await sender.wait()
        await _settled(url)
        return json.loads(out or b"{}")

    return side


async def _settled(url: str, quiet_s: float = 12.0, timeout_s: float = 300.0) -> None:
    """Until no tap's next seq moved for ``quiet_s`` (more than one request's CPU
    budget, ``worker.max_request_cpu_s``: no job is still running)."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = {t["name"]: t["next_seq"] for t in listing(url)}
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        await asyncio.sleep(0.25)


async def _warm_bomb(url: str) -> None:
    """The built-in frontend compresses a bomb once per size: not in a measured run."""
    kind, body, headers = hostile_requests(["256"])[-1]
    headers = {"Content-Type": "application/json", **headers}
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
            await r.read()


async def send_hostile(url: str, kinds: list[str]) -> dict[str, Any]:
    """The hostile requests in turn, one at a time, until SIGTERM: the counts per
    answer of each kind (``answers``) and when each was sent (``times``: kind and
    ``time.monotonic()``). ``kinds``: the first word of each kind to send (all when
    empty). Prints ``READY`` once the bodies are built."""
    requests = hostile_requests(kinds)
    sent: dict[str, dict[str, Any]] = {kind: {} for kind, _, _ in requests}
    times: list[tuple[str, float]] = []
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    timeout = aiohttp.ClientTimeout(total=120)
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    async with aiohttp.ClientSession(auto_decompress=False, timeout=timeout) as session:
        i = 0
        start = time.monotonic()
        while not stop.is_set():
            wait = start + i * HOSTILE_INTERVAL_S - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            if stop.is_set():
                break
            kind, body, headers = requests[i % len(requests)]
            i += 1
            headers = {"Content-Type": "application/json", **headers}
            times.append((kind, time.monotonic()))
            try:
                async with session.post(
                    url + "/v1/chat/completions", data=body, headers=headers
                ) as r:
                    await r.read()
                    status = str(r.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                status = type(exc).__name__
            sent[kind][status] = sent[kind].get(status, 0) + 1
    return {"answers": sent, "times": times}


async def hostile(kind: str, args, scratch: Path) -> dict[str, Any]:
    requests = args.requests or 2000
    concurrency = args.concurrency or 32
    processes = args.processes or os.cpu_count() or 1
    pace = (args.ttft_ms, args.itl_ms)
    frontend = await Frontend.start(kind, scratch, pace=pace, speedup=args.speedup, cpus=None)
    await _warm_bomb(frontend.url)
    worker = {"processes": processes, "max_rss_mb": MAX_RSS_MB}
    # The senders start over one paced request's time: started at once, they run in
    # step for about a second, in waves of `concurrency` arrivals, and those waves'
    # 1.6% of the requests were the TTFT p99 of every case (20261202 diagnosis).
    osl = args.osl or 16
    base = LoadSpec(
        url="",
        model=MODEL_NAME,
        requests=requests,
        concurrency=concurrency,
        prompt_tokens=args.isl or 512,
        output_tokens=osl,
        ramp_s=(args.ttft_ms + osl * args.itl_ms) / 1000,
    )
    side = hostile_traffic(args.hostile)
    cases = {"proxy+hostile": side, "taps": None, "taps+hostile": side}
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    try:
        for rnd in range(args.rounds):
            for case in list(cases) if rnd % 2 == 0 else list(reversed(cases)):
                spec = evolved(base, seed=rnd)
                warmup = evolved(
                    base,
                    seed=rnd + 500,
                    requests=args.warmup,
                    concurrency=min(concurrency, args.warmup),
                )
                run = await run_case(
                    case, frontend, scratch, args, spec, warmup, False, worker, side=cases[case]
                )
                runs[case].append(run)
                print(
                    f"[hostile] round {rnd + 1} {case}: {run['report'].summary()} "
                    f"hostile: {(run['side'] or {}).get('answers')}",
                    flush=True,
                )
    finally:
        frontend.stop()
    summary = {c: aggregate(r) for c, r in runs.items()}
    sent: dict[str, dict[str, int]] = {}
    for run in runs["taps+hostile"]:
        for what, statuses in run["side"]["answers"].items():
            for status, n in statuses.items():
                sent.setdefault(what, {})[status] = sent.setdefault(what, {}).get(status, 0) + n
    text = "".join(run["metrics"] for run in runs["taps+hostile"])
    counted = {
        "not mirrored, prompt over budget": counter(
            text, "shadow_not_mirrored_total", reason="prompt_over_budget"
        ),
        "responses cut at max_decoded_bytes": counter(
            text, "shadow_worker_budget_exceeded_total", budget="decoded"
        ),
        "responses cut past n x max_tokens events": counter(
            text, "shadow_worker_budget_exceeded_total", budget="events"
        ),
        "responses cut at max_request_cpu_s": counter(
            text, "shadow_worker_budget_exceeded_total", budget="cpu"
        ),
        "shards recycled (max_rss_mb)": counter(
            text, "shadow_worker_shard_restarts_total", reason="recycled"
        ),
        "shards died": counter(text, "shadow_worker_shard_restarts_total", reason="died"),
        "records dropped late": counter(text, "shadow_tap_dropped_total", reason="late"),
    }
    # The lag with hostile traffic, and without it (what the load alone costs a
    # worker that runs only on the CPU the serving side leaves it).
    lag: dict[str, Any] = {}
    for case in ("taps+hostile", "taps"):
        case_text = "".join(run["metrics"] for run in runs[case])
        for tap in TAP_NAMES:
            merged: dict[float, float] = {}
            for run in runs[case]:
                for le, value in buckets(
                    run["metrics"], "shadow_tap_record_lag_seconds", tap=tap
                ).items():
                    merged[le] = merged.get(le, 0.0) + value
            late = counter(case_text, "shadow_tap_dropped_total", tap=tap, reason="late")
            lag[f"{tap} ({case})"] = {
                "lag_p99_s": histogram_quantile({}, merged, 0.99),
                "published": merged.get(float("inf"), 0.0),
                "late": late,
            }
    bound = processes * MAX_RSS_MB + MAIN_ALLOWANCE_MB
    p, h = summary["proxy+hostile"], summary["taps+hostile"]
    targets = [
        (
            f"worker peak RSS MiB <= {processes} x max_rss_mb + {MAIN_ALLOWANCE_MB}",
            h["rss_mb_peak"].get("worker"),
            bound,
            False,
        ),
        (
            "beside hostile traffic, taps / no taps: TTFT p50 <= 1.05",
            h["ttft_p50_ms"] / p["ttft_p50_ms"],
            1.05,
            False,
        ),
        (
            "beside hostile traffic, taps / no taps: TTFT p99 <= 1.10",
            h["ttft_p99_ms"] / p["ttft_p99_ms"],
            1.10,
            False,
        ),
        (
            "beside hostile traffic, taps / no taps: req/s >= 0.95",
            h["requests_per_s"] / p["requests_per_s"],
            0.95,
            True,
        ),
    ]
    # A record queued behind a hostile request on the same shard waits at most
    # that request's CPU budget (worker.max_request_cpu_s, 5 s) and its own turn.
    targets += [
        (f"{tap}: record lag p99 s <= 2 x max_request_cpu_s", v["lag_p99_s"], 10.0, False)
        for tap, v in lag.items()
        if tap.endswith("(taps+hostile)")
    ]
    cases_out = {
        c: {
            **v,
            "worker_peak_rss_mb": v["rss_mb_peak"].get("worker"),
            "proxy_peak_rss_mb": v["rss_mb_peak"].get("proxy"),
        }
        for c, v in summary.items()
    }
    return {
        "regime": "hostile",
        "frontend": frontend.label,
        "requests": requests,
        "concurrency": concurrency,
        "processes": processes,
        "rounds": args.rounds,
        "cases": cases_out,
        "lag": lag,
        "hostile_sent": sent,
        "counted": counted,
        "targets": targets,
        PLOT: _ttft_plot_data(runs),
    }


#: A part's key for what ``plots.ttft`` draws; taken out before the JSON is written.
PLOT = "_plot"


def _ttft_plot_data(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each case's TTFTs (ms, every round) and its first round's timeline: each
    request's send time and TTFT, and when each hostile request was sent (seconds
    from the start of the measured load)."""
    out: dict[str, Any] = {"ttft_ms": {}, "timeline": {}, "hostile_at": {}}
    for case, case_runs in runs.items():
        timed = [
            [r for r in run["report"].results if r.ok and r.ttft_s is not None] for run in case_runs
        ]
        out["ttft_ms"][case] = [r.ttft_s * 1000 for results in timed for r in results]
        out["timeline"][case] = [(r.sent_s, r.ttft_s * 1000) for r in timed[0]]
        first = case_runs[0]
        origin = first["report"].origin_monotonic
        out["hostile_at"][case] = [
            (kind, t - origin) for kind, t in (first["side"] or {}).get("times", [])
        ]
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(send_hostile(sys.argv[1], sys.argv[2:]))))
