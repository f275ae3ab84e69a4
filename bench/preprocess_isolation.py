"""Does preprocessing touch the serving loop? Event-loop lag with and without the worker process.

Two proxies in front of the built-in frontend, each with ``SHADOW_PROXY_LOOP_LAG=1``
(the serving loop samples how late a 10 ms sleep wakes up):

- ``worker``: the shipped design, two taps, preprocessing in the tap worker process;
- ``inline``: the naive design, no taps, the same preprocessing done by a middleware
  on the serving loop (what a sidecar that tokenizes "in the request path" does).

Both receive the same load of long prompts (default 16k tokens) so that
preprocessing saturates its CPU; the table gives the serving loop's lag p50/p99,
the clients' TTFT and the preprocessing rate. Run from the repository root:

    .venv/bin/python -m bench.preprocess_isolation [--isl 16384] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import aiohttp

from shadow_proxy.devtools.loadgen import LoadSpec, run_load
from shadow_proxy.devtools.processes import (
    Child,
    cli_argv,
    reserve_endpoint,
    reserve_port,
    wait_http_ok,
)
from shadow_proxy.devtools.reference_taps import TAP_NAMES, proxy_config, reference_taps
from shadow_proxy.devtools.reference_taps import write_config as reference_write_config

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / ".models" / "deepseek"


def write_config(path: Path, port: int, upstream: str, taps: bool) -> None:
    """The proxy's configuration: the reference taps (``worker``) or none (``inline``)."""
    endpoints = [reserve_endpoint() for _ in TAP_NAMES]
    mapping = proxy_config(
        upstream,
        port=port,
        models={"deepseek": MODEL},
        taps=reference_taps(endpoints) if taps else (),
    )
    reference_write_config(path, mapping)


INLINE_SERVER = """
import sys, uvloop
from aiohttp import web
from shadow_proxy.serving.app import make_app
from shadow_proxy.config import Config
from shadow_proxy.exchange import classify
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model

config = Config.from_yaml(sys.argv[1])
models = {m.name: load_model(m.name, m.tokenizer, m.context_length) for m in config.models}
preprocessor = Preprocessor(models)

@web.middleware
async def inline(request, handler):
    route = classify(request.method, request.path)
    if route.mirrored:
        preprocessor.preprocess(route, await request.read(), 0)
    return await handler(request)

app = make_app(config)
app.middlewares.append(inline)
web.run_app(app, host="127.0.0.1", port=config.listen.port, handler_cancellation=True,
            access_log=None, print=None, loop=uvloop.new_event_loop())
"""


def lag_quantiles(metrics_text: str) -> tuple[float, float, int]:
    """p50 and p99 (upper bucket bounds, ms) of shadow_proxy_loop_lag_seconds."""
    buckets = []
    for line in metrics_text.splitlines():
        if line.startswith("shadow_proxy_loop_lag_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0

    def q(p: float) -> float:
        for le, count in buckets:
            if count >= p * total:
                return le * 1000
        return float("nan")

    return q(0.5), q(0.99), int(total)


async def measure(url: str, spec: LoadSpec) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            before = await r.text()
        report = await run_load(spec)
        async with s.get(url + "/metrics") as r:
            after = await r.text()
    del before  # the histogram is cumulative; the warm-up is small against the run
    p50, p99, samples = lag_quantiles(after)
    summary = report.summary()
    return {
        "loop_lag_p50_ms": p50,
        "loop_lag_p99_ms": p99,
        "lag_samples": samples,
        "requests_per_s": summary["requests_per_s"],
        "ttft_p50_ms": summary["ttft_p50_ms"],
        "ttft_p99_ms": summary["ttft_p99_ms"],
        "errors": summary["errors"],
    }


async def main_async(args: argparse.Namespace) -> int:
    env = {**os.environ, "SHADOW_PROXY_LOOP_LAG": "1", "TRANSFORMERS_VERBOSITY": "error"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        fe_port = reserve_port()
        frontend = f"http://127.0.0.1:{fe_port}"
        argv = cli_argv("mock-frontend", "--port", str(fe_port), "--model", f"deepseek={MODEL}")
        with Child("frontend", argv, logs, merge_output=True) as frontend_child:
            await wait_http_ok(frontend + "/health", 60, children=[frontend_child])
            for case in ("worker", "inline"):
                port = reserve_port()
                config = logs / f"{case}.yaml"
                write_config(config, port, frontend, taps=case == "worker")
                if case == "worker":
                    cmd = cli_argv("serve", "--config", str(config))
                else:
                    cmd = [sys.executable, "-c", INLINE_SERVER, str(config)]
                with Child(case, cmd, logs, env=env, merge_output=True) as proxy:
                    url = f"http://127.0.0.1:{port}"
                    await wait_http_ok(url + "/healthz", 60, children=[proxy])
                    warm = LoadSpec(
                        url=url,
                        model="deepseek",
                        requests=8,
                        concurrency=4,
                        prompt_tokens=args.isl,
                        output_tokens=args.osl,
                    )
                    await run_load(warm)
                    spec = LoadSpec(
                        url=url,
                        model="deepseek",
                        requests=args.requests,
                        concurrency=args.concurrency,
                        prompt_tokens=args.isl,
                        output_tokens=args.osl,
                        seed=1,
                    )
                    results[case] = await measure(url, spec)
                    await proxy.stop(30)
    print(
        f"Serving-loop lag, prompts of {args.isl} tokens, {args.requests} streaming requests, "
        f"concurrency {args.concurrency}, built-in frontend:\n"
    )
    print(
        "| preprocessing | loop lag p50 ms | loop lag p99 ms | req/s | TTFT p50 ms "
        "| TTFT p99 ms | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    names = {"worker": "in the tap worker process (shipped)", "inline": "on the serving loop"}
    for case, r in results.items():
        print(
            f"| {names[case]} | {r['loop_lag_p50_ms']:.1f} | {r['loop_lag_p99_ms']:.1f} "
            f"| {r['requests_per_s']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} "
            f"| {r['errors']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isl", type=int, default=16384)
    parser.add_argument("--osl", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
