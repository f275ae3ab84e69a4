"""One case of a benchmark regime (what it starts, the load it measures, what it
reads after) and the aggregation of its rounds."""

from __future__ import annotations

import asyncio
import collections
import json
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.procfs import cpu_seconds, cpu_tree_seconds, rss_mb, rss_tree_mb
from bench.services import (
    OTHER_CPU,
    PROXY_CPU,
    Frontend,
    get_text,
    service,
    start_nginx,
    start_proxy,
)
from shadow_proxy.devtools.loadgen import LoadSpec, percentile, run_load
from shadow_proxy.devtools.processes import (
    Child,
    cli_argv,
)

CASES = ("direct", "nginx", "proxy", "taps", "taps-stalled")
CASE_TITLES = {
    "direct": "1 direct",
    "nginx": "2 nginx",
    "proxy": "3 shadow-proxy, no taps",
    "proxy-no-quick-ack": "3b shadow-proxy, no taps, upstream.quick_ack off",
    "taps": "4 two taps, consumers reading",
    "taps-stalled": "5 two taps, consumers SIGSTOPped",
    "proxy+neighbour": "6 no taps, CPU-bound neighbour",
    "taps+neighbour": "7 two taps reading, CPU-bound neighbour",
    "taps-stalled+neighbour": "8 two taps stopped, CPU-bound neighbour",
}
#: The same cases with a CPU-bound neighbour process on the proxy's core.
NEIGHBOUR_CASES = ("proxy+neighbour", "taps+neighbour", "taps-stalled+neighbour")
#: A CPU-bound neighbour: a busy loop at normal priority.
NEIGHBOUR = [sys.executable, "-c", "while True: pass"]


class Setup:
    """What one case runs besides the frontend, started fresh for each run."""

    def __init__(self, case: str, frontend: Frontend):
        self.case = case
        self.url = frontend.url
        self.services: list[Child] = []
        self.consumers: list[tuple[str, Child, Path]] = []
        self.pids: dict[str, int] = dict(frontend.pids)
        self.lag_url: str | None = None

    @classmethod
    async def start(
        cls,
        case: str,
        frontend: Frontend,
        scratch: Path,
        isolate: bool,
        worker: dict[str, Any] | None = None,
    ) -> Setup:
        """Start what ``case`` needs; returns once it answers."""
        self = cls(case, frontend)
        proxy_cpus = PROXY_CPU if isolate else None
        other_cpus = OTHER_CPU if isolate else None
        if case.endswith("+neighbour"):
            case = self.case = case.removesuffix("+neighbour")
            self.services.append(service("neighbour", NEIGHBOUR, scratch, cpus=PROXY_CPU))
        if case == "nginx":
            child, self.url, worker = await start_nginx(frontend.url, scratch, proxy_cpus)
            self.services.append(child)
            self.pids["proxy"] = worker
        elif case != "direct":
            taps = case.startswith("taps")
            child, self.url, worker_pid, endpoints = await start_proxy(
                frontend.url,
                scratch,
                taps,
                proxy_cpus,
                worker,
                quick_ack=case != "proxy-no-quick-ack",
            )
            self.services.append(child)
            self.pids["proxy"] = child.pid
            self.lag_url = self.url + "/metrics"
            if worker_pid is not None:
                self.pids["worker"] = worker_pid
            for i, (name, endpoint, topic) in enumerate(endpoints):
                summary = scratch / f"consumer-{i}.json"
                summary.unlink(missing_ok=True)
                # At nice 19: in a deployment the consumers run elsewhere; here they
                # share the frontend's core and must not take its CPU.
                argv = [
                    "nice",
                    "-n",
                    "19",
                    *cli_argv(
                        "consumer",
                        "--endpoint",
                        endpoint,
                        "--topic",
                        topic,
                        "--summary-path",
                        str(summary),
                        "--interval",
                        "60",
                        log_level=None,
                    ),
                ]
                consumer = service(f"consumer-{i}", argv, scratch, cpus=other_cpus)
                self.consumers.append((name, consumer, summary))
            if self.consumers:
                await asyncio.sleep(1.0)  # the subscriptions reach the PUB sockets
                if case == "taps-stalled":
                    for _, consumer, _ in self.consumers:
                        consumer.signal(signal.SIGSTOP)
        return self

    def finish_consumers(self) -> dict[str, Any]:
        """Resume, let what is buffered arrive, stop; each tap's consumer summary."""
        out = {}
        if not self.consumers:
            return out
        for _, consumer, _ in self.consumers:
            consumer.signal(signal.SIGCONT)
        time.sleep(2.5)  # a heartbeat, and the backlog of a resumed consumer
        keys = ("records", "tap_gaps", "tail_loss", "transport_gaps", "duplicates")
        return stop_consumers(self.consumers, keys)

    def stop(self) -> None:
        for _, consumer, _ in self.consumers:
            consumer.terminate()
        for child in self.services:
            child.terminate()


def stop_consumers(
    consumers: list[tuple[str, Child, Path]], keys: tuple[str, ...]
) -> dict[str, Any]:
    """Stop each tap's consumer (SIGTERM: it writes its summary) and read its
    totals ``keys`` and the drops its last heartbeat reported."""
    out: dict[str, Any] = {}
    for name, consumer, path in consumers:
        if not consumer.alive:  # it ended before the run did: its totals are not the run's
            out[name] = {"error": f"consumer exited early ({consumer.terminate()})"}
            continue
        consumer.terminate()
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            out[name] = {"error": "no summary"}
            continue
        out[name] = {k: summary.get(k) for k in keys}
        heartbeat = (summary.get("publishers") or [{}])[0].get("last_heartbeat") or {}
        out[name]["dropped"] = heartbeat.get("dropped", {})
    return out


def lag_buckets(url: str | None) -> dict[float, float]:
    if url is None:
        return {}
    out = {}
    pattern = re.compile(r'^shadow_proxy_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', re.M)
    for le, value in pattern.findall(get_text(url)):
        out[float(le)] = float(value)
    return out


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float):
    """Quantile of the observations between two cumulative bucket snapshots,
    interpolated linearly within the bucket (as Prometheus does)."""
    if not after:
        return None
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    lower, prev = 0.0, 0.0
    for bound, cum in zip(bounds, counts, strict=True):
        if cum >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - prev) / max(cum - prev, 1e-12)
        lower, prev = bound, cum
    return lower


class RssSampler:
    """Peak RSS of the given pids, read every 0.2 s in a thread-free task."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.peak: dict[str, float] = dict.fromkeys(pids, 0.0)
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.2)

    def sample(self) -> None:
        for role, pid in self.pids.items():
            value = _rss(role, pid)
            if value == value:  # not NaN
                self.peak[role] = max(self.peak[role], value)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        self.sample()
        if self._task is not None:
            self._task.cancel()


async def run_case(
    case: str,
    frontend: Frontend,
    scratch: Path,
    args,
    spec: LoadSpec,
    warmup: LoadSpec,
    isolate: bool,
    worker: dict[str, Any] | None = None,
    settle_s: float = 0.0,
    side: Side | None = None,
) -> dict[str, Any]:
    """One run of ``case``; ``side(url, ready, stop)``, if given, runs beside the
    measured load until ``stop`` is set (the hostile regime's traffic) and what it
    returns is the run's ``side``. It starts before the warm-up and the measured load
    waits until it has set ``ready`` (its traffic under way): its own start-up (a
    Python process building its bodies) is not what the case measures."""
    setup = await Setup.start(case, frontend, scratch, isolate, worker)
    beside = None
    try:
        url_spec = {"url": setup.url}
        stop, ready = asyncio.Event(), asyncio.Event()
        if side:
            beside = asyncio.create_task(side(setup.url, ready, stop))
        await run_load(evolved(warmup, **url_spec))
        if beside:
            await _side_ready(beside, ready)
        rss_before = {role: _rss(role, pid) for role, pid in setup.pids.items()}
        cpu_before = {role: _cpu(role, pid) for role, pid in setup.pids.items()}
        own_before = time.process_time()
        lag_before = lag_buckets(setup.lag_url)
        with RssSampler(setup.pids) as sampler:
            try:
                report = await run_load(evolved(spec, **url_spec))
            finally:
                stop.set()
            side_result = await beside if beside else None
        cpu_after = {role: _cpu(role, pid) for role, pid in setup.pids.items()}
        own = time.process_time() - own_before
        lag = histogram_quantile(lag_before, lag_buckets(setup.lag_url), 0.99)
        if setup.lag_url and "worker" in setup.pids:
            # The worker's backlog published or given up, and its metrics relayed.
            await asyncio.sleep(settle_s + 1.5)
        metrics_text = get_text(setup.lag_url) if setup.lag_url else ""
        consumers = setup.finish_consumers()
    finally:
        if beside and not beside.done():
            beside.cancel()
        setup.stop()
    cpu = {role: cpu_after[role] - cpu_before[role] for role in cpu_before}
    cpu["loadgen"] = own
    return {
        "case": case,
        "report": report,
        "cpu_s": cpu,
        "rss_mb_start": rss_before,
        "rss_mb_peak": sampler.peak,
        "loop_lag_p99_ms": None if lag is None else lag * 1000,
        "consumers": consumers,
        "metrics": metrics_text,
        "side": side_result,
    }


#: Traffic beside a case's measured load: ``side(url, ready, stop)`` sets ``ready``
#: once its traffic is under way and runs until ``stop`` is set.
Side = Callable[[str, asyncio.Event, asyncio.Event], Awaitable[Any]]

#: How long a side may take to get its traffic under way.
SIDE_READY_TIMEOUT_S = 60.0


async def _side_ready(beside: asyncio.Task, ready: asyncio.Event) -> None:
    """Until ``ready`` is set; a side that ended or failed first raises here."""
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait(
        {beside, waiter}, timeout=SIDE_READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
    )
    waiter.cancel()
    if not ready.is_set():
        if beside in done:
            beside.result()
        raise RuntimeError(f"the side traffic was not under way in {SIDE_READY_TIMEOUT_S:g} s")


def _cpu(role: str, pid: int) -> float:
    """The tap worker is its main and its shards."""
    return cpu_tree_seconds(pid) if role == "worker" else cpu_seconds(pid)


def _rss(role: str, pid: int) -> float:
    return rss_tree_mb(pid) if role == "worker" else rss_mb(pid)


def evolved(spec: LoadSpec, **changes: Any) -> LoadSpec:
    import attrs

    return attrs.evolve(spec, **changes)


# --------------------------------------------------------------------------- aggregation


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled over rounds: latencies over every request, rates over total time."""
    results = [r for run in runs for r in run["report"].results]
    ok = [r for r in results if r.ok]
    duration = sum(run["report"].duration_s for run in runs)
    ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    e2e = sorted(r.e2e_s for r in ok)
    roles = sorted({role for run in runs for role in run["cpu_s"]})
    cpu_per_k = {
        role: 1000 * sum(run["cpu_s"].get(role, 0.0) for run in runs) / max(1, len(results))
        for role in roles
    }
    lags = [run["loop_lag_p99_ms"] for run in runs if run["loop_lag_p99_ms"] is not None]
    peak = collections.defaultdict(float)
    for run in runs:
        for role, value in run["rss_mb_peak"].items():
            peak[role] = max(peak[role], value)
    consumers: dict[str, dict[str, Any]] = {}
    for run in runs:
        for tap, s in run["consumers"].items():
            total = consumers.setdefault(
                tap,
                {"records": 0, "tap_gaps": 0, "tail_loss": 0, "transport_gaps": 0, "dropped": {}},
            )
            for key in ("records", "tap_gaps", "tail_loss", "transport_gaps"):
                total[key] += s.get(key) or 0
            for reason, n in (s.get("dropped") or {}).items():
                total["dropped"][reason] = total["dropped"].get(reason, 0) + n
    per_round_rps = [run["report"].summary()["requests_per_s"] for run in runs]
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "requests_per_s": len(ok) / duration if duration else 0.0,
        "requests_per_s_rounds": per_round_rps,
        "ttft_p50_ms": _ms(percentile(ttft, 50)),
        "ttft_p99_ms": _ms(percentile(ttft, 99)),
        "e2e_p50_ms": _ms(percentile(e2e, 50)),
        "e2e_p99_ms": _ms(percentile(e2e, 99)),
        "cpu_s_per_1000": cpu_per_k,
        "rss_mb_peak": dict(peak),
        "loop_lag_p99_ms": max(lags) if lags else None,
        "consumers": consumers,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def run_json(run: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in run.items() if k not in ("report", "metrics")}
    out["load"] = run["report"].summary()
    return out
