"""shadow-trace speed: ``analyze`` in block touches per second, ``export`` in records per second.

Run with the project's venv (one core, nothing else running):

    .venv/bin/python -m bench.bench_trace [--conversations 2000] [--turns 8] \
        [--block-size 16,64,512]

Builds a synthetic multi-turn workload in memory (conversations on a few shared
system prompts, each turn extending its own history by a user message and an
answer) and a record file of it, then measures, after one warm-up run that
compiles the kernels:
- analyze, core: ``kernels.lru_profile`` alone on prepared fingerprints;
- analyze, whole: ``ReuseAnalysis`` from decoded requests to the curves
  (fingerprints, ordering, one LRU pass per block size);
- analyze and export from the record file through ``shadow-trace`` (decode,
  selection, hashing, writing).
A block touch is one full block of one request at one block size. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import numpy as np

from shadow_proxy.records import envelope as records
from shadow_proxy.records import wire
from shadow_proxy.records.files import RecordFile
from shadow_proxy.trace import kernels
from shadow_proxy.trace.blocks import token_array
from shadow_proxy.trace.cli import main as trace_main
from shadow_proxy.trace.reuse import ReuseAnalysis, parse_block_sizes
from shadow_proxy.trace.selection import TraceRequest

T0 = 1_700_000_000_000_000_000


def workload(conversations: int, turns: int, seed: int = 1) -> list[np.ndarray]:
    """Prompts in arrival order: conversations interleaved, turns growing."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 100_000, int(rng.integers(200, 1500))) for _ in range(8)]
    history = [systems[int(rng.integers(0, len(systems)))] for _ in range(conversations)]
    left = [turns] * conversations
    prompts = []
    live = list(range(conversations))
    while live:
        c = live[int(rng.integers(0, len(live)))]
        user = rng.integers(0, 100_000, int(rng.integers(20, 400)))
        history[c] = np.concatenate([history[c], user])
        prompts.append(history[c].astype(np.uint32))
        history[c] = np.concatenate([history[c], rng.integers(0, 100_000, 150)])
        left[c] -= 1
        if left[c] == 0:
            live.remove(c)
    return prompts


def requests_of(prompts: list[np.ndarray]) -> list[TraceRequest]:
    return [
        TraceRequest(T0 + i * 1_000_000, f"r{i}", "m", "kv", token_array(p), 64, None, None, False)
        for i, p in enumerate(prompts)
    ]


def write_file(path: Path, prompts: list[np.ndarray]) -> None:
    out = RecordFile(path, max_bytes=1 << 40, keep=0)
    for i, prompt in enumerate(prompts):
        envelope = records.build_envelope(
            tap="kv",
            seq=i,
            request_id=f"r{i}",
            origin="chat",
            filters=[],
            arrival_unix_ns=T0 + i * 1_000_000,
            sample_rate=1.0,
            request={
                "model": "m",
                "token_ids": prompt.tolist(),
                "stop_conditions": {"max_tokens": 64},
            },
            response=None,
        )
        out.write(wire.Message("t", 1, i, 0, wire.encode_envelope(envelope)))
    out.close()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def quiet(argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert trace_main(argv) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--block-size", type=parse_block_sizes, default=(16, 64, 512))
    args = parser.parse_args()
    sizes = args.block_size

    prompts = workload(args.conversations, args.turns)
    requests = requests_of(prompts)
    tokens = sum(int(p.size) for p in prompts)
    touches = {b: sum(int(p.size) // b for p in prompts) for b in sizes}

    def whole() -> None:
        analysis = ReuseAnalysis(sizes)
        analysis.extend(requests)
        analysis.result()

    small = ReuseAnalysis(sizes)
    small.extend(requests[:10])
    small.result()  # compiles the kernels (cached on disk afterwards)

    rows = []
    for b in sizes:
        lane1, lane2, counts = kernels.prefix_fingerprints(
            np.concatenate(prompts),
            np.array([p.size for p in prompts], np.int64),
            np.zeros(len(prompts), np.uint64),
            b,
            False,
        )
        seconds = timed(lambda l1=lane1, l2=lane2, c=counts: kernels.lru_profile(l1, l2, c))
        rows.append((f"analyze core (lru_profile), B={b}", touches[b], "touches", seconds))
    total = sum(touches.values())
    rows.append((f"analyze, whole, B={','.join(map(str, sizes))}", total, "touches", timed(whole)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.bin"
        write_file(path, prompts)
        block_arg = ",".join(map(str, sizes))
        seconds = timed(lambda: quiet(["analyze", str(path), "--block-size", block_arg]))
        rows.append(("shadow-trace analyze FILE (decode included)", total, "touches", seconds))
        for fmt in ("mooncake", "dynamo"):
            out = str(Path(tmp) / f"{fmt}.jsonl")
            seconds = timed(
                lambda f=fmt, o=out: quiet(["export", str(path), "--format", f, "-o", o])
            )
            rows.append((f"shadow-trace export --format {fmt}", len(prompts), "records", seconds))

    print(f"{len(prompts):,} requests, {tokens:,} prompt tokens, block touches {touches}\n")
    print("| what | count | unit | seconds | per second |")
    print("| --- | ---: | --- | ---: | ---: |")
    for what, count, unit, seconds in rows:
        print(f"| {what} | {count:,} | {unit} | {seconds:.3f} | {count / seconds:,.0f} |")


if __name__ == "__main__":
    main()
