"""Parts of the tap worker's cost, each against the way it was done before, in one
process (issue 34, fourth round): ratios of alternated runs, not timed tests.

- ``render``: the chat template's render of every turn of the multiturn regime's
  conversations (``worker_multiturn.conversations``, answers of random tokens as
  the mocker's), with the messages as MiniJinja's own values
  (``minijinja_env.native_messages``) and as Python values the binding converts
  at every read::

    .venv/bin/python -m bench.worker_parts
    .venv/bin/python -m bench.worker_parts --part render --conversations 8

- ``answer``: an answer's output encode (the largest part of a shard), a
  ~680-token answer of random tokens as the mocker streams, encoded by a fresh
  tokenizer (its word cache cold, as for a new answer): the library whole,
  against its pre-tokenizer's regexes run in Python (the ``regex`` module) and
  only the byte-level map and BPE left to the library, the words handed over as
  pre-tokenized input, or each word mapped in Python and handed to the model's
  BPE (``model.tokenize``); and the library with its word cache warm (issue 34,
  fifth round). Sixth round: DeepSeek's three splits run as one
  (``worker/request/pre_tokenizer.py``, what the worker now loads), cold and
  warm. Every way must give the library's ids (checked)::

    .venv/bin/python -m bench.worker_parts --part answer

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
from typing import Any

import msgspec
import regex
from tokenizers import Tokenizer

from bench.services import MODEL_DIR, MODEL_NAME
from bench.worker_multiturn import conversations
from shadow_proxy.config import Config
from shadow_proxy.devtools.reference_taps import proxy_config, reference_taps
from shadow_proxy.worker.request.pre_tokenizer import faster_pre_tokenizer
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
    """Each case's median, and each case over the last one, paired run by run."""
    *news, (old, old_runs) = runs.items()
    medians = ", ".join(f"{k} {1e6 * statistics.median(v):.1f} us" for k, v in runs.items())
    ratios = "; ".join(
        f"{new} / {old} "
        f"{statistics.median(a / b for a, b in zip(new_runs, old_runs, strict=True)):.2f}"
        for new, new_runs in news
    )
    print(f"{label}: {medians} {unit} (median of {len(old_runs)}); {ratios}")


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


def _python_split(patterns: list[Any]) -> Callable[[str], list[str]]:
    """Tokenizers' ``Split`` with ``Isolated`` behaviour, in sequence, by ``regex``."""

    def split(text: str) -> list[str]:
        pieces = [text]
        for pattern in patterns:
            out = []
            for piece in pieces:
                at = 0
                for match in pattern.finditer(piece):
                    start, end = match.span()
                    if start > at:
                        out.append(piece[at:start])
                    out.append(piece[start:end])
                    at = end
                if at < len(piece):
                    out.append(piece[at:])
            pieces = out
        return pieces

    return split


def _byte_level_map() -> dict[int, str]:
    """``ByteLevel``'s byte-to-character map (GPT-2's), for ``str.translate`` of a
    word's UTF-8 bytes read as Latin-1."""
    shown = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in shown}
    hidden = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + i) for i, b in enumerate(hidden)})
    return chars


def answer_part(n: int, repeats: int) -> None:
    os.environ.update(RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    spec = json.loads((MODEL_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    steps = spec["pre_tokenizer"]["pretokenizers"]
    splits, byte_level = steps[:-1], steps[-1]
    if not all(s["type"] == "Split" and s["behavior"] == "Isolated" for s in splits) or (
        byte_level["type"] != "ByteLevel" or byte_level["use_regex"]
    ):
        raise SystemExit("answer: the model's pre-tokenizer is not Split..., ByteLevel")
    split = _python_split([regex.compile(s["pattern"]["Regex"]) for s in splits])
    bpe_only = json.dumps({**spec, "pre_tokenizer": byte_level})
    whole = json.dumps(spec)
    probe = Tokenizer.from_str(whole)
    merged_probe = Tokenizer.from_str(whole)
    if faster_pre_tokenizer(merged_probe) is None:
        raise SystemExit("answer: the model's pre-tokenizer is not DeepSeek's three splits")
    rng = random.Random(1)
    vocab = probe.get_vocab_size()
    answers = []
    for _ in range(8 * n):
        ids = [rng.randrange(1000, vocab - 1000) for _ in range(680)]
        answers.append("".join(probe.decode([i]) for i in ids))
    library = [probe.encode_batch_fast([a], add_special_tokens=False)[0].ids for a in answers]
    for a in answers:  # the merged tokenizer's word cache warm too
        merged_probe.encode_batch_fast([a], add_special_tokens=False)

    byte_map = _byte_level_map()

    def run(how: str) -> float:
        if how == "warm":
            tokenizer = probe  # has encoded these answers once
        elif how == "merged warm":
            tokenizer = merged_probe
        elif how == "merged":
            tokenizer = Tokenizer.from_str(whole)
            faster_pre_tokenizer(tokenizer)
        else:
            tokenizer = Tokenizer.from_str(whole if how == "library" else bpe_only)
        encode, model = tokenizer.encode_batch_fast, tokenizer.model
        started = time.thread_time()
        got = []
        for a in answers:
            if how == "split + model":
                ids: list[int] = []
                for word in split(a):
                    mapped = word.encode("utf-8").decode("latin-1").translate(byte_map)
                    ids.extend(token.id for token in model.tokenize(mapped))
            elif how == "split":
                ids = encode([split(a)], is_pretokenized=True, add_special_tokens=False)[0].ids
            else:
                ids = encode([a], add_special_tokens=False)[0].ids
            got.append(ids)
        seconds = (time.thread_time() - started) / len(answers)
        if got != library:
            raise SystemExit(f"answer: {how!r} gave other ids than the library")
        return seconds

    for how in ("merged", "split", "split + model", "library"):
        run(how)  # untimed: the first run of a way pays its one-off set-up
    runs = alternate(
        {
            "the three splits as one": lambda: run("merged"),
            "the three splits as one, word cache warm": lambda: run("merged warm"),
            "python split + library BPE": lambda: run("split"),
            "python split + model.tokenize per word": lambda: run("split + model"),
            "library, word cache warm": lambda: run("warm"),
            "library": lambda: run("library"),
        },
        repeats,
    )
    report(f"answer encode ({len(answers)} answers of 680 random tokens)", "an answer", runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("render", "answer"), default="render")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    if args.part == "render":
        render_part(args.conversations, args.repeats)
    else:
        answer_part(args.conversations, args.repeats)


if __name__ == "__main__":
    main()
