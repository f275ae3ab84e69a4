"""The machine's own ceiling for the scaling regime: the tap worker's heaviest
step alone (encoding ~2k-token prompts with the real DeepSeek tokenizer), in one
process and in two, with no proxy, no hand-off and no publishing.

    .venv/bin/python -m bench.machine_scaling [--prompts N] [--rounds R]

Prints prompts/s for one and two processes and their ratio, per round. The
scaling regime's target (2 cores >= 1.8x 1 core) cannot be met by the worker
where this ratio is below it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path

from shadow_proxy.devtools import modeldirs

TEXT = "the quick brown fox jumps over a lazy dog while shadow proxies mirror traffic " * 160


def _encode(path: str, prompts: int, out: multiprocessing.Queue) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    tokenizer.encode(TEXT)  # warm
    started = time.perf_counter()
    for i in range(prompts):
        tokenizer.encode(f"{TEXT}{i}")
    out.put(time.perf_counter() - started)


def prompts_per_s(path: str, processes: int, prompts: int) -> float:
    out: multiprocessing.Queue = multiprocessing.Queue()
    workers = [
        multiprocessing.Process(target=_encode, args=(path, prompts, out)) for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return processes * prompts / max(out.get() for _ in workers)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bench.machine_scaling", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--prompts", type=int, default=300, help="per process and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", type=Path, default=Path(".models"), help="model dirs")
    args = parser.parse_args()
    path = str(modeldirs.build_all(args.models)["deepseek"] / "tokenizer.json")
    for rnd in range(args.rounds):
        one = prompts_per_s(path, 1, args.prompts)
        two = prompts_per_s(path, 2, args.prompts)
        print(
            f"round {rnd + 1}: 1 process {one:.0f} prompts/s, 2 processes {two:.0f} "
            f"prompts/s: {two / one:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
