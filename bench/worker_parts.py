"""Parts of the tap worker's cost, each against the way it was done before, in one
process (issue 34, fourth round): ratios of alternated runs, not timed tests.

- ``render``: the chat template's render of every turn of the multiturn regime's
  conversations (``worker_multiturn.conversations``, answers of random tokens as
  the mocker's), with the messages as MiniJinja's own values
  (``minijinja_env.native_messages``) and as Python values the binding converts
  at every read::

    .venv/bin/python -m bench.worker_parts
    .venv/bin/python -m bench.worker_parts --part render --conversations 8

(At 22fdf19 a ``read`` part compared reads into a kept buffer with ``recv``; the
change it measured was not kept: docs/benchmarks.md, fourth round.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable

import msgspec

from bench.services import MODEL_DIR, MODEL_NAME
from bench.worker_multiturn import conversations
from shadow_proxy.config import Config
from shadow_proxy.devtools.reference_taps import proxy_config, reference_taps
from shadow_proxy.worker.request.templates import dynamo
from shadow_proxy.worker.shard.models import load_models


def alternate(cases: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each case's seconds per unit, run in turn ``repeats`` times."""
    out: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, run in cases.items():
            out[name].append(run())
    return out


def report(label: str, unit: str, runs: dict[str, list[float]]) -> None:
    (new, new_runs), (old, old_runs) = runs.items()
    paired = statistics.median(a / b for a, b in zip(new_runs, old_runs, strict=True))
    medians = ", ".join(f"{k} {1e6 * statistics.median(v):.1f} us" for k, v in runs.items())
    print(f"{label}: {medians} {unit} (median of {len(new_runs)}); {new} / {old} {paired:.2f}")


def render_part(n: int, repeats: int) -> None:
    os.environ.update(RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    taps = reference_taps([f"inproc://tap{i}" for i in range(2)])
    config = Config.from_mapping(
        proxy_config("http://127.0.0.1:9", models={MODEL_NAME: str(MODEL_DIR)}, taps=taps)
    )
    model = load_models(config)[MODEL_NAME]
    template, tokenizer = model.chat_template, model.backend
    rng = random.Random(1)
    vocab = tokenizer.get_vocab_size()
    bodies = []
    for talk in conversations(n, seed=0):
        history = [{"role": "system", "content": talk.system}]
        for user, reply in talk.turns:
            history.append({"role": "user", "content": user})
            bodies.append(json.dumps({"model": MODEL_NAME, "messages": list(history)}).encode())
            ids = [rng.randrange(1000, vocab - 1000) for _ in range(len(reply.split()))]
            answer = "".join(tokenizer.decode([i]) for i in ids)
            history.append({"role": "assistant", "content": answer})
    native = dynamo.native_messages

    def run(on: bool) -> float:
        dynamo.native_messages = native if on else (lambda *_: None)  # type: ignore[assignment]
        requests = [msgspec.json.decode(body) for body in bodies]  # fresh strings, as a shard has
        started = time.thread_time()
        for request in requests:
            template.render(request)
        return (time.thread_time() - started) / len(requests)

    try:
        runs = alternate({"native": lambda: run(True), "python": lambda: run(False)}, repeats)
    finally:
        dynamo.native_messages = native
    report(f"render ({len(bodies)} turns of {n} conversations)", "a render", runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("render",), default="render")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    if args.part == "render":
        render_part(args.conversations, args.repeats)


if __name__ == "__main__":
    main()
