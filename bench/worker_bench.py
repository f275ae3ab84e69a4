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
  request (run it with ``--frontend dynamo``). Each turn resends the bench's
  own answer text (8 tokens asked for), or with ``--answers frontend`` asks for
  that many tokens and resends what the frontend streamed, as agents do (the
  worker then finds each answer's ids from its record). Targets: <= 0.3x the
  full re-encode, <= 0.5x the frontend; the prompt-token mismatch metric stays 0.
- ``overload``: long prompts at a rate the worker, pinned with the proxy to
  one core, cannot follow: record lag p99 stays under ``worker.max_lag_s``
  (requests past it are dropped as ``late`` and counted), and the clients'
  latency does not move (two taps against none).
- ``hostile`` (issue 18): a paced load beside a stream of hostile requests, one
  a second: a 62 MB chat request of 600 tools x 1,000 properties and a 7 MiB
  prompt (both answered 400 by the frontend before it parses them, so that only
  the proxy pays for them), and a 0.9 MB gzip response that decodes to 256 MiB
  (3 million events), asked for with max_tokens 4 and without.
  The worker's peak RSS (main and shards, sampled every 0.2 s) stays within
  ``processes x worker.max_rss_mb`` + 512 MiB; the other clients' latency with
  two taps against none (both beside the hostile traffic) and their records'
  lag stay within the isolation bounds and twice a request's CPU budget.
  The load's senders start over one paced request's time (``LoadSpec.ramp_s``)
  and the hostile sender is under way before the measured load: started at once,
  the senders' first waves were every case's TTFT p99. ``<stem>-ttft.png`` draws
  each case's TTFT tail and round 1 as a timeline with the hostile requests marked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from bench.cases import Side, aggregate, evolved, histogram_quantile, run_case
from bench.procfs import children, cpu_seconds
from bench.services import MODEL_NAME, OTHER_CPU, PROXY_CPU, REPO, Frontend, get_text, start_proxy
from shadow_proxy.devtools.conversations import answer_text
from shadow_proxy.devtools.loadgen import LoadSpec, make_prompt, many_tools, run_load
from shadow_proxy.devtools.reference_taps import TAP_NAMES

HISTOGRAM = re.compile(r'^(\w+)_bucket\{(.*?)le="([^"]+)"(.*?)\} (\S+)$', re.M)


def metrics(url: str) -> str:
    return get_text(url + "/metrics")


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
    return [main, *children(main)]


# --------------------------------------------------------------------------- scaling


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
    await _published(url, start, sent)
    elapsed = time.monotonic() - t0
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
    return {
        "records": sent,
        "seconds": elapsed,
        "records_per_s": sent / elapsed,
        "worker_cpu_ms_per_record": 1000 * cpu / max(1, sent),
    }


async def _published(url: str, start: dict[str, int], sent: int, timeout: float = 600) -> None:
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


# --------------------------------------------------------------------------- multiturn


@attrs.frozen
class Talk:
    """One conversation: its system message, then each turn's user message and the
    answer the bench resends for it (or the length of the one asked for)."""

    system: str
    turns: list[tuple[str, str]]


def conversations(n: int, seed: int, tag: str = "") -> list[Talk]:
    """10-30 turns, growing to 8k-32k tokens (words of the load generator: about a
    token each), a third of each turn the user's, two thirds the answer's.
    ``tag`` opens every system message: the same conversations under another tag
    share no prefix."""
    rng = random.Random(seed)
    out = []
    for c in range(n):
        turns = rng.randint(10, 30)
        final = rng.randint(8_000, 30_000)
        per_turn = (final - 1_000) // turns
        system = f"{tag}Agent {c}. " + make_prompt(rng, 1_000)
        pairs = [
            (make_prompt(rng, per_turn // 3), make_prompt(rng, 2 * per_turn // 3))
            for _ in range(turns)
        ]
        out.append(Talk(system, pairs))
    return out


async def _converse(
    url: str, talks: list[Talk], concurrency: int, answers: str = "synthetic"
) -> int:
    """Each conversation turn by turn, ``concurrency`` conversations at a time.
    ``answers``: ``synthetic`` resends the bench's own answer text (8 tokens
    asked for); ``frontend`` asks for as many tokens and resends what the
    frontend streamed, as agents do."""
    sem = asyncio.Semaphore(concurrency)
    sent = 0

    async def talk(index: int, conversation: Talk) -> None:
        nonlocal sent
        # As agents talking to Dynamo do: the session header on every turn (the
        # worker keeps a conversation on one shard by it).
        headers = {"x-dynamo-session-id": f"conv-{index}"}
        messages: list[dict[str, Any]] = [{"role": "system", "content": conversation.system}]
        async with sem, aiohttp.ClientSession() as session:
            for user, reply in conversation.turns:
                messages.append({"role": "user", "content": user})
                real = answers == "frontend"
                body = {
                    "model": MODEL_NAME,
                    "messages": messages,
                    "max_tokens": len(reply.split()) if real else 8,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                async with session.post(
                    url + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    raw = await r.read()
                    sent += r.status == 200
                answer = answer_text(raw) if real else reply
                messages.append({"role": "assistant", "content": answer})

    await asyncio.gather(*(talk(i, t) for i, t in enumerate(talks)))
    return sent


async def multiturn(kind: str, args, scratch: Path) -> dict[str, Any]:
    n = args.conversations
    env = {"DYN_TOKENIZER_CACHE": "0"} if args.dynamo_tokenizer_cache == "off" else None
    frontend = await Frontend.start(
        kind, scratch, pace=None, speedup=1000.0, cpus=None, dynamo_env=env
    )
    cases = {"incremental": {}, "full re-encode": {"tokenizer_cache_bytes": 0}}
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    try:
        for rnd in range(args.rounds):
            order = list(cases) if rnd % 2 == 0 else list(reversed(cases))
            for case in order:
                # The same conversations for both cases of a round (the CPU per
                # request depends on their lengths), tagged per case so that no
                # prefix cache of the frontend's carries over from the other case.
                talks = conversations(n, seed=100 * rnd, tag=f"[{case}] ")
                worker = {"max_lag_s": None, **cases[case]}
                if args.processes:
                    worker["processes"] = args.processes
                service, url, main, _ = await start_proxy(frontend.url, scratch, True, None, worker)
                try:
                    pids = {
                        "worker": worker_pids(main),
                        **{r: [p] for r, p in frontend.pids.items()},
                    }
                    start = {t["name"]: t["next_seq"] for t in listing(url)}
                    before = _cpu(pids)
                    sent = await _converse(url, talks, args.concurrency or 8, args.answers)
                    # Every record published: a worker that fell behind pays its
                    # backlog inside the measure (a fixed wait once left it out).
                    await _published(url, start, sent)
                    after = _cpu(pids)
                    text = metrics(url)
                finally:
                    service.terminate()
                run = {
                    f"{role}_cpu_ms_per_request": 1000 * (after[role] - before[role]) / sent
                    for role in before
                }
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
        (
            "incremental / full re-encode worker CPU per request <= 0.3",
            inc["worker_cpu_ms_per_request"] / max(1e-9, full["worker_cpu_ms_per_request"]),
            0.3,
            False,
        ),
        (
            "incremental worker CPU / frontend CPU per request <= 0.5",
            inc["worker_cpu_ms_per_request"] / max(1e-9, inc["frontend_cpu_ms_per_request"]),
            0.5,
            False,
        ),
        ("prompt-token mismatches == 0", inc["mismatches"] + full["mismatches"], 0, False),
    ]
    return {
        "regime": "multiturn",
        "frontend": frontend.label,
        "conversations": n,
        "answers": args.answers,
        "rounds": args.rounds,
        "cases": summary,
        "runs": runs,
        "targets": targets,
    }


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    return {role: sum(cpu_seconds(pid) for pid in group) for role, group in pids.items()}


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


# --------------------------------------------------------------------------- hostile

#: The worker's memory bound the regime holds it to (README, Bounds): each shard is
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
    """Run ``python -m bench.worker_bench URL`` (the hostile sender, a process of its
    own so that the load generator's loop measures undisturbed); ``ready`` once it
    has built its bodies and starts sending, until told to stop; then wait until the
    worker has published or dropped everything (its taps' seqs still for 12 s) and
    return what each hostile kind got back."""

    async def side(url: str, ready: asyncio.Event, stop: asyncio.Event) -> dict[str, Any]:
        sender = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.worker_bench",
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


# --------------------------------------------------------------------------- entry, output


async def run(regime: str, kind: str, args, scratch: Path) -> dict[str, Any]:
    regimes = {"scaling": scaling, "multiturn": multiturn, "overload": overload, "hostile": hostile}
    return await regimes[regime](kind, args, scratch)


def markdown(result: dict[str, Any], command: str) -> str:
    m = result["machine"]
    out = [
        f"## shadow-proxy bench: {result['regime']} ({result['started']})",
        "",
        f"Command: `{command}`  ",
        f"Machine: {m['cpu_model']}, {m['cores']} cores, load average at start "
        f"{m['loadavg_at_start']}",
        "",
    ]
    for part in result["parts"]:
        out.append(f"### {part['regime']}: {part['frontend']}")
        out.append("")
        out.append("| case | " + " | ".join(_keys(part["cases"])) + " |")
        out.append("|---|" + "---:|" * len(_keys(part["cases"])))
        for name, values in part["cases"].items():
            cells = [_cell(values.get(k)) for k in _keys(part["cases"])]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
        if part.get("plot"):
            out += [
                f"![time to first token: every round's tail, and round 1's timeline]"
                f"({part['plot']})",
                "",
            ]
        if part.get("lag"):
            out.append("| tap | record lag p99 s | published | dropped late |")
            out.append("|---|---:|---:|---:|")
            for tap, v in part["lag"].items():
                out.append(
                    f"| {tap} | {_cell(v['lag_p99_s'])} | {_cell(v['published'])} | "
                    f"{_cell(v['late'])} |"
                )
            out.append("")
        if part.get("hostile_sent"):
            out.append("| hostile request | answers (status: count) |")
            out.append("|---|---|")
            for what, statuses in part["hostile_sent"].items():
                answers = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
                out.append(f"| {what} | {answers} |")
            out.append("")
            out.append("| counted by the proxy (taps+hostile) | |")
            out.append("|---|---:|")
            out += [f"| {what} | {_cell(n)} |" for what, n in part["counted"].items()]
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


if __name__ == "__main__":
    print(json.dumps(asyncio.run(send_hostile(sys.argv[1], sys.argv[2:]))))
