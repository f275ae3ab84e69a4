"""What ``shadow-replay --score`` costs the replayer in CPU per record.

``python -m bench.bench_score [--records N] [--positions P] [--top-k K]``. Not
part of the tests. Builds vLLM-shaped scoring answers (``prompt_logprobs``:
K + 1 entries per position) for N records of P output positions, then times,
in this process: JSON decoding of the three answers per record (candidate,
baseline, baseline again), ``logprobs.Scoring.from_response``,
``scores.ScoreTally.add`` (means, KL bounds, tool-call masks) and, once, the
summary (bootstraps, McNemar, Mann-Whitney, the verdict). Prints CPU seconds
per 1,000 records. The engine's own cost (one prefill per scoring) is not in
it: measure that with the engine's metrics.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from shadow_proxy.replay.logprobs import Scoring
from shadow_proxy.replay.scores import ScoreTally


def answer(rng: random.Random, output: list[int], top_k: int) -> bytes:
    entries: list[object] = [None] * 20
    for token in output:
        entry = {
            str(rng.randrange(50_000)): {
                "logprob": -rng.uniform(1, 12),
                "rank": r + 1,
                "decoded_token": "x",
            }
            for r in range(top_k)
        }
        entry[str(token)] = {
            "logprob": -rng.uniform(0, 12),
            "rank": rng.randint(1, 20),
            "decoded_token": "tok",
        }
        entries.append(entry)
    return json.dumps({"choices": [{"index": 0, "prompt_logprobs": entries}]}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_score")
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--positions", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=10)
    args = parser.parse_args()
    rng = random.Random(0)
    bodies = []
    for _ in range(args.records):
        output = [rng.randrange(50_000) for _ in range(args.positions)]
        bodies.append((output, [answer(rng, output, args.top_k) for _ in range(3)]))
    tally = ScoreTally(top_k=args.top_k)
    started = time.process_time()
    for i, (output, raw) in enumerate(bodies):
        c, b, again = (Scoring.from_response(json.loads(r), output) for r in raw)
        tally.add(
            c,
            b,
            again,
            greedy=i % 3 != 0,
            exact=(i % 5 != 0, i % 7 != 0),
            lengths=(len(output), len(output)),
        )
    per_record = time.process_time() - started
    tally.summary()
    total = time.process_time() - started
    scale = 1000 / args.records
    print(
        f"{args.records} records x {args.positions} positions, top {args.top_k}: "
        f"{total * scale:.2f} s CPU per 1,000 records "
        f"({per_record * scale:.2f} s decoding and adding, "
        f"{(total - per_record):.2f} s the summary)"
    )


if __name__ == "__main__":
    main()
