"""The ``multiturn`` regime: conversations of 10 to 30 turns growing to 8k-32k
tokens, interleaved like agent traffic; the worker's CPU per request with
incremental tokenization against a full re-encode and the frontend's own (see
``worker_bench.py``)."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from bench.procfs import cpu_seconds
from bench.scrape import counter, listing, metrics, worker_pids
from bench.services import MODEL_DIR, MODEL_NAME, Frontend, start_proxy
from bench.worker_scaling import published
from shadow_proxy.devtools.conversations import answer_text
from shadow_proxy.devtools.loadgen import make_prompt


@attrs.frozen
class Talk:
    """One conversation: its system message, then each turn's user message and the
    answer the bench resends for it (or the length of the one asked for)."""

    system: str
    turns: list[tuple[str, str]]


@attrs.frozen
class Size:
    """How long the conversations grow: turns, final length in words of the load
    generator (about a token each), and the system message's words."""

    turns: tuple[int, int]
    words: tuple[int, int]
    system: int


SIZES = {
    # Agent sessions: 10-30 turns to 8k-30k tokens.
    "long": Size((10, 30), (8_000, 30_000), 1_000),
    # Chat sessions that fit a 4,096-token context (vLLM's tiny Llama): 4-6
    # turns to 1.2k-2k words, each answer 40-170 tokens.
    "short": Size((4, 6), (1_200, 2_000), 500),
}


def conversations(n: int, seed: int, tag: str = "", size: Size = SIZES["long"]) -> list[Talk]:
    """``size.turns`` turns growing to ``size.words`` words, a third of each turn
    the user's, two thirds the answer's. ``tag`` opens every system message: the
    same conversations under another tag share no prefix."""
    rng = random.Random(seed)
    out = []
    for c in range(n):
        turns = rng.randint(*size.turns)
        final = rng.randint(*size.words)
        per_turn = (final - size.system) // turns
        system = f"{tag}Agent {c}. " + make_prompt(rng, size.system)
        pairs = [
            (make_prompt(rng, per_turn // 3), make_prompt(rng, 2 * per_turn // 3))
            for _ in range(turns)
        ]
        out.append(Talk(system, pairs))
    return out


#: What each ``--answers`` streams and resends, as the report's heading says it.
ANSWERS = {
    "synthetic": "8 tokens asked for, the bench's own text resent",
    "frontend": "the frontend's (random ids: the mocker, or a random-weight model), resent",
    "words": "the bench's English replies, streamed by the mocker (output replay), resent",
}


async def _converse(
    url: str,
    talks: list[Talk],
    concurrency: int,
    answers: str = "synthetic",
    scripted: dict[str, str] | None = None,
    round_tag: str = "",
) -> int:
    """Each conversation turn by turn, ``concurrency`` conversations at a time.
    ``answers``: ``synthetic`` resends the bench's own answer text (8 tokens
    asked for); ``frontend`` asks for as many tokens and resends what the
    frontend streamed, as agents do; ``words`` the same, each request naming
    its answer in the mocker's output-replay trace (``scripted``: key -> the
    text it must stream; ``answer_key``)."""
    sem = asyncio.Semaphore(concurrency)
    sent = 0

    async def talk(index: int, conversation: Talk) -> None:
        nonlocal sent
        # As agents talking to Dynamo do: the session header on every turn (the
        # worker keeps a conversation on one shard by it).
        headers = {"x-dynamo-session-id": f"conv-{index}"}
        messages: list[dict[str, Any]] = [{"role": "system", "content": conversation.system}]
        async with sem, aiohttp.ClientSession() as session:
            for turn, (user, reply) in enumerate(conversation.turns):
                messages.append({"role": "user", "content": user})
                real = answers != "synthetic"
                body: dict[str, Any] = {
                    "model": MODEL_NAME,
                    "messages": messages,
                    "max_tokens": len(reply.split()) if real else 8,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                key = answer_key(round_tag, index, turn)
                if scripted is not None:
                    body["nvext"] = {"annotations": [f"output_replay_id:{key}"]}
                async with session.post(
                    url + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    raw = await r.read()
                    sent += r.status == 200
                answer = answer_text(raw) if real else reply
                if scripted is not None and r.status == 200 and answer != scripted[key]:
                    raise SystemExit(
                        f"multiturn: the mocker did not stream answer {key} as scripted "
                        "(its output-replay trace unread?); no figures"
                    )
                messages.append({"role": "assistant", "content": answer})

    await asyncio.gather(*(talk(i, t) for i, t in enumerate(talks)))
    return sent


def answer_key(round_tag: str, conversation: int, turn: int) -> str:
    """A turn's answer in the mocker's output-replay trace (``--answers words``)."""
    return f"{round_tag}c{conversation}-t{turn}"


def scripted_answers(
    rounds: int, n: int, size: Size, trace: Path
) -> tuple[dict[str, str], tuple[str, ...]]:
    """The mocker's output-replay trace for ``--answers words``: each turn's answer
    the bench's own reply, as many of its token ids as the request asks for
    (``max_tokens``: its word count), keyed by ``answer_key``. Returns what each
    answer streams as text, and the mocker's arguments that read the trace."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    texts: dict[str, str] = {}
    with trace.open("w") as out:
        for rnd in range(rounds):
            # The replies do not depend on the tag: both cases of a round share them.
            for c, talk in enumerate(conversations(n, seed=100 * rnd, size=size)):
                for turn, (_user, reply) in enumerate(talk.turns):
                    ids = tokenizer.encode(reply, add_special_tokens=False).ids
                    ids = ids[: len(reply.split())]
                    key = answer_key(f"r{rnd}-", c, turn)
                    texts[key] = tokenizer.decode(ids)
                    line = {
                        "timestamp": 0,
                        "input_length": 1,
                        "output_length": len(ids),
                        "hash_ids": [0],
                        "request_id": key,
                        "output_token_ids": ids,
                    }
                    out.write(json.dumps(line) + "\n")
    return texts, ("--response-replay-trace-path", str(trace))


async def multiturn(kind: str, args, scratch: Path) -> dict[str, Any]:
    n = args.conversations
    size_name = args.conversation_size or ("short" if kind == "vllm" else "long")
    if kind == "vllm" and size_name != "short":
        raise SystemExit(
            "multiturn: vLLM's tiny Llama holds 4,096 tokens: --conversation-size short"
        )
    size = SIZES[size_name]
    env = {"DYN_TOKENIZER_CACHE": "0"} if args.dynamo_tokenizer_cache == "off" else None
    scripted, mocker_args = None, ()
    if args.answers == "words":
        if kind != "dynamo":
            raise SystemExit("multiturn: --answers words needs Dynamo's mocker (--frontend dynamo)")
        scratch.mkdir(parents=True, exist_ok=True)
        scripted, mocker_args = scripted_answers(args.rounds, n, size, scratch / "answers.jsonl")

    async def start_frontend(rnd: int = 0) -> Frontend:
        # Each frontend its own directory: Dynamo's file discovery must not see
        # the engine of the one before.
        home = scratch / f"frontend-{rnd}" if rnd else scratch
        home.mkdir(parents=True, exist_ok=True)
        return await Frontend.start(
            kind,
            home,
            pace=None,
            speedup=1000.0,
            cpus=None,
            dynamo_env=env,
            mocker_args=mocker_args,
        )

    # One frontend for the run, or (--new-frontend-each-round) a new one for each
    # round: the frontend's CPU a request moves over a long run (docs/benchmarks.md,
    # issue 34's fifth round), and a new one takes that out of the yardstick.
    new_each_round = args.new_frontend_each_round
    frontend = await start_frontend()
    cases = {"incremental": {}, "full re-encode": {"tokenizer_cache_bytes": 0}}
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    #: The allocators the worker's shards said they ran on, over every case and round.
    mallocs: set[str] = set()
    try:
        for rnd in range(args.rounds):
            if new_each_round and rnd:
                frontend.stop()
                frontend = await start_frontend(rnd)
            order = list(cases) if rnd % 2 == 0 else list(reversed(cases))
            for case in order:
                # The same conversations for both cases of a round (the CPU per
                # request depends on their lengths), tagged per case so that no
                # prefix cache of the frontend's carries over from the other case.
                talks = conversations(n, seed=100 * rnd, tag=f"[{case}] ", size=size)
                worker = {"max_lag_s": None, **cases[case]}
                if args.processes:
                    worker["processes"] = args.processes
                if args.worker_malloc:
                    worker["malloc"] = args.worker_malloc
                service, url, main, _ = await start_proxy(
                    frontend.url, scratch, True, None, worker, frontend_kind=kind
                )
                try:
                    shards = [p for p in worker_pids(main) if p != main]
                    pids = {
                        "worker": [main, *shards],
                        "worker_main": [main],
                        "worker_shards": shards,
                        **{r: [p] for r, p in frontend.pids.items()},
                    }
                    start = {t["name"]: t["next_seq"] for t in listing(url)}
                    before = _cpu(pids)
                    sent = await _converse(
                        url, talks, args.concurrency or 8, args.answers, scripted, f"r{rnd}-"
                    )
                    if not sent:  # no CPU per request, so no ratio: say so, judge nothing
                        raise SystemExit(
                            f"multiturn: round {rnd + 1} ({case}): the frontend answered no "
                            "request with 200; no figures"
                        )
                    # Every record published: a worker that fell behind pays its
                    # backlog inside the measure (a fixed wait once left it out).
                    await published(url, start, sent)
                    after = _cpu(pids)
                    text = metrics(url)
                finally:
                    service.terminate()
                run = {
                    f"{role}_cpu_ms_per_request": 1000 * (after[role] - before[role]) / sent
                    for role in before
                }
                run["requests"] = sent
                run["mismatches"] = counter(text, "shadow_prompt_token_mismatches_total")
                encoded = counter(text, "shadow_tokenizer_tokens_total", source="encoded")
                reused = counter(text, "shadow_tokenizer_tokens_total", source="reused")
                run["tokens_encoded_fraction"] = (
                    encoded / (encoded + reused) if encoded + reused else None
                )
                mallocs |= _mallocs(text)
                runs[case].append(run)
                print(f"[multiturn] round {rnd + 1} {case}: {run}", flush=True)
    finally:
        frontend.stop()
    summary = {c: _median(r) for c, r in runs.items()}
    inc, full = summary["incremental"], summary["full re-encode"]
    # Each ratio paired within a round (the same conversations, the same minute of
    # this noisy machine), then the median over the rounds.
    worker = "worker_cpu_ms_per_request"
    per_round = {
        "incremental / full re-encode": [
            i[worker] / max(1e-9, f[worker])
            for i, f in zip(runs["incremental"], runs["full re-encode"], strict=True)
        ],
        "worker / frontend": [
            i[worker] / max(1e-9, i["frontend_cpu_ms_per_request"]) for i in runs["incremental"]
        ],
        # The yardstick, shown: the frontend's CPU a request on the same
        # conversations moves between a round's two cases and, with one frontend
        # for the run, over the run (docs/benchmarks.md, issue 34's fifth round).
        "worker CPU ms a request (incremental)": [i[worker] for i in runs["incremental"]],
        "frontend CPU ms a request (incremental)": [
            i["frontend_cpu_ms_per_request"] for i in runs["incremental"]
        ],
        "frontend CPU ms a request (full re-encode, same conversations)": [
            f["frontend_cpu_ms_per_request"] for f in runs["full re-encode"]
        ],
    }
    targets = [
        (
            "incremental / full re-encode worker CPU per request <= 0.3 (median of rounds)",
            statistics.median(per_round["incremental / full re-encode"]),
            0.3,
            False,
            per_round["incremental / full re-encode"],
        ),
        (
            "incremental worker CPU / frontend CPU per request <= 0.6 (issue 34; median of rounds)",
            statistics.median(per_round["worker / frontend"]),
            0.6,
            False,
            per_round["worker / frontend"],
        ),
        ("prompt-token mismatches == 0", inc["mismatches"] + full["mismatches"], 0, False),
    ]
    label = frontend.label + (", a new one each round" if new_each_round else "")
    label += f"; the worker's shards on {' and '.join(sorted(mallocs)) or 'an unreported malloc'}"
    label += "; answers: " + ANSWERS[args.answers]
    return {
        "regime": "multiturn",
        "frontend": label,
        "conversations": n,
        "conversation_size": f"{size_name}: {size.turns[0]}-{size.turns[1]} turns to "
        f"{size.words[0]:,}-{size.words[1]:,} words",
        "answers": args.answers,
        "rounds": args.rounds,
        "cases": summary,
        "runs": runs,
        "ratios_per_round": per_round,
        "targets": targets,
    }


def _mallocs(text: str) -> set[str]:
    """The allocators ``shadow_worker_malloc_processes`` counts shards on."""
    found = set()
    for line in text.splitlines():
        if line.startswith('shadow_worker_malloc_processes{library="'):
            head, _, value = line.rpartition(" ")
            if float(value) > 0:
                found.add(head.split('"')[1])
    return found


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    return {role: sum(cpu_seconds(pid) for pid in group) for role, group in pids.items()}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for key in runs[0]:
        values = sorted(r[key] for r in runs if r[key] is not None)
        out[key] = values[len(values) // 2] if values else None
    return out
