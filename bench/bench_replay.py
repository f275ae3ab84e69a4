"""How fast shadow-replay can send, and what each request costs it in CPU.

``python -m bench.bench_replay --help``. Not part of the tests; run it on a quiet
machine. Each round:

1. the built-in frontend runs in a process of its own (``shadow-proxy
   mock-frontend``, no added latency unless ``--ttft-ms``/``--itl-ms``), pinned
   to ``--frontend-cpus`` with ``taskset`` when given;
2. a record file of ``--requests`` joined records is written with the
   consumer's ``RecordFile`` (prompts of ``--prompt-tokens`` token ids,
   ``--max-tokens`` output tokens, the built-in frontend's own output as the
   primary's, so comparisons find equal outputs);
3. ``shadow-replay FILE --candidate URL --speed max --concurrency N`` runs as a
   child process (pinned to ``--replay-cpus`` when given); its wall time comes
   from summary.json (``run.elapsed_s``), its CPU from the child's rusage
   (user + system, whole process: start-up, tokenizer load and plots included)
   and, without those, ``run.cpu_s`` of summary.json (the process's CPU while
   it replayed).

Reported per round and as the median over ``--rounds``: requests/s, output
tokens/s, CPU ms per request, and the replayer's own share of a core
(CPU s / wall s). A replayer at 100% of a core while the frontend is not is the
bottleneck. For the side-by-side with AIPerf the script prints the equivalent
``aiperf profile`` command (streaming, same concurrency, same request count)
against the same frontend and, when AIPerf is installed (``make aiperf``), runs
it after each replay round (its rate from its own export, its CPU from rusage)
and reports the replayer's rate over AIPerf's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.tables import commit
from shadow_proxy.devtools.frontend import MockConfig, ServedModel
from shadow_proxy.devtools.processes import Child, cli_argv, reserve_port, wait_http_ok
from shadow_proxy.records.files import RecordFile
from shadow_proxy.records.wire import Message, encode_envelope

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / ".models" / "deepseek"
AIPERF = Path(os.environ.get("AIPERF_BIN") or ROOT / ".aiperf" / "venv" / "bin" / "aiperf")


def _pinned(argv: list[str], cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if cpus and shutil.which("taskset") else argv


def frontend_ids(max_tokens: int) -> list[int]:
    """The token ids of the built-in frontend's output of ``max_tokens`` tokens."""
    model = ServedModel.load("deepseek", MockConfig(models={"deepseek": MODEL}).models["deepseek"])
    text = model.output_text(max_tokens)
    return model.tokenizer.encode(text, add_special_tokens=False).ids


def bench_envelope(
    k: int, prompt_tokens: int, max_tokens: int, ids: list[int], arrival_ns: int
) -> dict[str, Any]:
    """Joined record ``k``: a prompt of ``prompt_tokens`` ids, ``ids`` as the primary's output."""
    prompt = [(k * 7 + j) % 30000 + 100 for j in range(prompt_tokens)]
    return {
        "schema_version": 1,
        "tap": "bench",
        "seq": k,
        "request_id": f"bench-{k}",
        "origin": "completions",
        "filters": [],
        "arrival_unix_ns": arrival_ns,
        "request": {
            "model": "deepseek",
            "token_ids": prompt,
            "stop_conditions": {"max_tokens": max_tokens},
            "sampling_options": {},
            "output_options": {},
        },
        "response": {
            "outcome": "complete",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length",
                    "output_tokens": max_tokens,
                    "token_ids": ids,
                }
            ],
            "output_tokens": max_tokens,
            "first_token_offset_ns": 5_000_000,
            "last_token_offset_ns": 50_000_000,
            "end_offset_ns": 51_000_000,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens},
        },
    }


def write_records(path: Path, args: argparse.Namespace) -> None:
    """``--requests`` joined records, the built-in frontend's output as the primary's."""
    ids = frontend_ids(args.max_tokens)
    start = time.time_ns()
    out = RecordFile(path, max_bytes=1 << 40, keep=0)
    for k in range(args.requests):
        envelope = bench_envelope(
            k, args.prompt_tokens, args.max_tokens, ids, start + k * 1_000_000
        )
        out.write(Message("bench", 1, k, 0, encode_envelope(envelope)))
    out.close()


def one_round(records: Path, url: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "shadow_proxy.replay.cli",
        str(records),
        "--candidate",
        url,
        "--out",
        str(out),
        "--speed",
        "max",
        "--concurrency",
        str(args.concurrency),
    ]
    if args.no_compare:
        argv.append("--no-compare")
    else:
        argv += ["--tokenizer", str(MODEL)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(_pinned(argv, args.replay_cpus), check=True, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = json.loads((out / "summary.json").read_text())
    wall = summary["run"]["elapsed_s"]
    replay_cpu = summary["run"]["cpu_s"]
    done = summary["replayed"]
    return {
        "replayed": done,
        "errors": summary["errors"],
        "exact_match_rate": summary["exact_match_rate"],
        "wall_s": wall,
        "process_cpu_s": round(cpu, 3),
        "replay_cpu_s": replay_cpu,
        "requests_per_s": round(done / wall, 1),
        "output_tokens_per_s": round(done * args.max_tokens / wall, 1),
        "cpu_ms_per_request": round(replay_cpu * 1000 / max(done, 1), 3),
        "core_share": round(replay_cpu / wall, 3),
    }


def aiperf_argv(url: str, args: argparse.Namespace, tokenizer: str, artifacts: Path) -> list[str]:
    """AIPerf driving the same frontend the same way: completions, streaming, the
    same concurrency, request count, prompt and output lengths."""
    return [
        "profile",
        "--model",
        "deepseek",
        "--tokenizer",
        tokenizer,
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--concurrency",
        str(args.concurrency),
        "--request-count",
        str(args.requests),
        "--synthetic-input-tokens-mean",
        str(args.prompt_tokens),
        "--synthetic-input-tokens-stddev",
        "0",
        "--output-tokens-mean",
        str(args.max_tokens),
        "--output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--artifact-dir",
        str(artifacts),
        "--ui-type",
        "none",
    ]


def aiperf_command(url: str, args: argparse.Namespace) -> str:
    return " ".join(["aiperf", *aiperf_argv(url, args, str(MODEL), Path("artifacts"))])


def aiperf_round(url: str, out: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """One AIPerf run (from ``.aiperf/venv``, ``make aiperf``): its request rate from
    its own export, its wall time and its CPU (every process it started, from
    rusage). None when AIPerf is not installed."""
    if not AIPERF.exists():
        return None
    # AIPerf's workers load the tokenizer offline by hub name: the model directory
    # as a Hugging Face cache entry (as tests/integration/test_trace_aiperf.py does).
    revision = "0" * 40
    entry = out / "hf" / "hub" / "models--shadow-proxy--deepseek"
    shutil.copytree(MODEL, entry / "snapshots" / revision)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(revision)
    env = {
        **os.environ,
        "HF_HOME": str(out / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HOME": str(out),
    }
    env.pop("VIRTUAL_ENV", None)
    argv = [str(AIPERF), *aiperf_argv(url, args, "shadow-proxy/deepseek", out / "artifacts")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run(
        _pinned(argv, args.replay_cpus),
        check=True,
        cwd=out,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    export = json.loads(next((out / "artifacts").rglob("profile_export_aiperf.json")).read_text())
    done = int(export["completed_request_count"]["avg"])
    return {
        "completed": done,
        "errors": len(export.get("error_summary") or []),
        "requests_per_s": round(export["request_throughput"]["avg"], 1),
        "output_tokens_per_s": round(export["output_token_throughput"]["avg"], 1),
        "process_wall_s": round(wall, 2),
        "process_cpu_s": round(cpu, 3),
        "cpu_ms_per_request": round(cpu * 1000 / max(done, 1), 3),
    }


def mock_frontend_argv(port: int, ttft_ms: float, itl_ms: float, max_tokens: int) -> list[str]:
    """The built-in frontend serving the DeepSeek dir on ``port`` at these latencies."""
    return cli_argv(
        "mock-frontend",
        "--port",
        str(port),
        "--model",
        f"deepseek={MODEL}",
        "--ttft-ms",
        str(ttft_ms),
        "--itl-ms",
        str(itl_ms),
        "--default-max-tokens",
        str(max_tokens),
        log_level=None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_replay", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    parser.add_argument("--no-compare", action="store_true")
    parser.add_argument(
        "--no-aiperf",
        action="store_true",
        help="do not run AIPerf beside each round (.aiperf/venv)",
    )
    parser.add_argument("--frontend-cpus", help="taskset list for the frontend, e.g. 0")
    parser.add_argument("--replay-cpus", help="taskset list for shadow-replay, e.g. 1")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    port = reserve_port()
    url = f"http://127.0.0.1:{port}"
    frontend_argv = mock_frontend_argv(port, args.ttft_ms, args.itl_ms, args.max_tokens)
    cpus = args.frontend_cpus if args.frontend_cpus and shutil.which("taskset") else None
    with Child("frontend", frontend_argv, scratch, cpus=cpus, merge_output=True) as frontend:
        asyncio.run(wait_http_ok(url + "/health", 60, children=[frontend]))
        records = scratch / "records.rec"
        write_records(records, args)
        rounds, aiperf = [], []
        for k in range(args.rounds):  # alternating, so that drift hits both alike
            rounds.append(one_round(records, url, scratch / f"out-{k}", args))
            if not args.no_aiperf:
                (scratch / f"aiperf-{k}").mkdir()
                aiperf.append(aiperf_round(url, scratch / f"aiperf-{k}", args))
        frontend.terminate(10)
    keys = ("requests_per_s", "output_tokens_per_s", "cpu_ms_per_request", "core_share")
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "json" and v is not None},
        "machine": {"cpus": os.cpu_count(), "commit": commit()},
        "rounds": rounds,
        "median": {k: statistics.median(r[k] for r in rounds) for k in keys},
        "aiperf_equivalent": aiperf_command(url, args),
    }
    ran = [a for a in aiperf if a]
    if ran:
        akeys = ("requests_per_s", "output_tokens_per_s", "cpu_ms_per_request")
        result["aiperf_rounds"] = ran
        result["aiperf_median"] = {k: statistics.median(a[k] for a in ran) for k in akeys}
        result["replay_rate_over_aiperf"] = round(
            result["median"]["requests_per_s"] / result["aiperf_median"]["requests_per_s"], 3
        )
    elif not args.no_aiperf:
        result["aiperf"] = f"not installed at {AIPERF} (make aiperf)"
    print(json.dumps(result, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
