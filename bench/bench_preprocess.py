"""Prompts per second of ``Preprocessor.preprocess`` at 128, 2048 and 16k prompt tokens.

Run with the project's venv: ``.venv/bin/python bench/bench_preprocess.py [--models DIR]``.
Builds the two local model directories if missing (no network) and prints a
Markdown table. Single process, single thread: the tap worker's view.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from shadow_proxy.devtools import modeldirs
from shadow_proxy.exchange import Route
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import load_model

TARGETS = (128, 2048, 16384)
FILLER = "the quick brown fox jumps over a lazy dog while shadow proxies mirror traffic 😀 "
MIN_SECONDS = 1.0


def chat_body(model, target: int) -> bytes:
    """A system turn and one user turn whose prompt has about ``target`` tokens."""
    text = FILLER
    while True:
        body = json.dumps(
            {
                "model": model.name,
                "messages": [
                    {"role": "system", "content": "You are helpful."},
                    {"role": "user", "content": text},
                ],
                "max_tokens": 16,
            }
        ).encode()
        pre = Preprocessor({model.name: model}).preprocess(Route.CHAT, body, 0)
        missing = target - len(pre.token_ids)
        if missing <= 0:
            return body
        text += FILLER * max(1, missing // 24)


def rate(pre: Preprocessor, body: bytes) -> tuple[float, int]:
    result = pre.preprocess(Route.CHAT, body, 0)
    assert isinstance(result, PreprocessedRequest), result
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < MIN_SECONDS or count < 5:
        pre.preprocess(Route.CHAT, body, 0)
        count += 1
    return count / elapsed, len(result.token_ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_preprocess.py",
        description="Prompts per second of the tap worker's preprocessing at "
        f"{', '.join(map(str, TARGETS))} prompt tokens, one thread; a Markdown table.",
    )
    parser.add_argument(
        "--models",
        type=Path,
        default=Path(".models"),
        help="the local model directories, built there if missing [.models]",
    )
    args = parser.parse_args(argv)
    dirs = modeldirs.build_all(args.models)
    # Longer prompts than the context would be refused; lift the limit for the bench.
    models = {name: load_model(name, str(path), 1_000_000) for name, path in dirs.items()}
    print("| model | prompt tokens | prompts/s | ms/prompt |")
    print("|---|---:|---:|---:|")
    for name, model in models.items():
        pre = Preprocessor({name: model})
        for target in TARGETS:
            per_second, tokens = rate(pre, chat_body(model, target))
            print(f"| {name} | {tokens} | {per_second:,.0f} | {1000 / per_second:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
