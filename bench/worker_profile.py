"""Where a shard's CPU goes on multi-turn traffic: cProfile of one shard's work in
one process (no sockets, no frontend).

The multiturn regime's conversations (``worker_multiturn.conversations``), each
turn's answer streamed back in Dynamo's chunk shape (one ``data:`` event per
token, ``usage`` in the last chunk) and resent as history, through a ``Joiner``
with the reference taps: hand-off messages encoded and decoded as the shard gets
them. Prints the CPU per request, split into request and response side, the
tokenizer's share (the prompt's new text, the answer's output ids) and the
whole CPU over the tokenizer's (the floor: encoding the new text alone), the
allocator it ran on, and the top functions. It runs on the shards' allocator
(``--malloc``, as ``worker.malloc``: by default it starts itself again with
jemalloc preloaded when the machine has it)::

    .venv/bin/python -m bench.worker_profile --conversations 4 --answer-tokens 200
    .venv/bin/python -m bench.worker_profile --history synthetic --sort none
    .venv/bin/python -m bench.worker_profile --sort none --malloc system   # glibc's malloc
    .venv/bin/python -m bench.worker_profile --sort none --answer-text words  # English answers
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import time
from typing import Any

from bench.services import MODEL_DIR, MODEL_NAME
from bench.worker_multiturn import SIZES, conversations
from shadow_proxy import allocator
from shadow_proxy.channel.handoff import KEY, Chunks, End, Head, Pieces, Request
from shadow_proxy.config import Config
from shadow_proxy.devtools.reference_taps import proxy_config, reference_taps
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker import messages
from shadow_proxy.worker.main.tap_queue import TapQueues
from shadow_proxy.worker.shard.joiner import Joiner
from shadow_proxy.worker.shard.models import load_models

HEAD = Head(200, 1_000, "text/event-stream", "")
#: Chunks per hand-off message (the serving loop's ``Capture.BATCH_CHUNKS``).
CHUNKS_PER_MESSAGE = 32


def dynamo_stream(pieces: list[str], prompt_tokens: int) -> list[bytes]:
    """One answer as Dynamo 1.6.1 streams it: a role chunk, a chunk per token, the
    finish, the usage chunk, ``[DONE]``; one body chunk per event."""
    rid = "chatcmpl-aedfb782-0d4e-43df-b602-248f61c88d6b"

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        obj = {
            "id": rid,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
            if "usage" not in extra
            else [],
            "created": 1796073640,
            "model": MODEL_NAME,
            "object": "chat.completion.chunk",
            **extra,
        }
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        return b"data: " + text.encode() + b"\n\n"

    out = [chunk({"role": "assistant"})]
    out += [chunk({"content": piece}) for piece in pieces]
    out.append(chunk({}, "length"))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(pieces),
        "total_tokens": prompt_tokens + len(pieces),
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    out.append(chunk({}, usage=usage))
    out.append(b"data: [DONE]\n\n")
    return out


class TokenizerClock:
    """The tokenizer, with the thread CPU time its batch encodes took."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.seconds = 0.0

    def encode_batch_fast(self, texts: list[str], **options: Any) -> Any:
        started = time.thread_time()
        try:
            return self.tokenizer.encode_batch_fast(texts, **options)
        finally:
            self.seconds += time.thread_time() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def messages_for(
    n: int, body: dict[str, Any], stream: list[bytes], events_per_chunk: int, session: str
) -> list[list[bytes]]:
    """The hand-off messages of one exchange, as frames: the events in chunks of
    ``events_per_chunk`` (as a proxy reads Dynamo's stream: two or three events a
    read once it flows), ``Capture.BATCH_CHUNKS`` chunks a message, the last two
    chunks with the end (``serving/handoff.py``)."""
    key = KEY.pack(n)
    now = time.monotonic_ns()
    raw = json.dumps(body).encode()
    # As the bench's agents send it (``worker_multiturn``): the session header.
    headers = f"x-dynamo-session-id:{session}\n".encode()
    out = [Request(key, Route.CHAT, time.time_ns(), now, 0, f"req-{n}", raw, headers).encode()]
    chunks = [
        b"".join(stream[i : i + events_per_chunk]) for i in range(0, len(stream), events_per_chunk)
    ]
    body_chunks, tail = chunks[:-2], chunks[-2:]
    for start in range(0, len(body_chunks), CHUNKS_PER_MESSAGE):
        part = body_chunks[start : start + CHUNKS_PER_MESSAGE]
        offsets = [2_000 + start + i for i in range(len(part))]
        head = HEAD if start == 0 else None
        out.append(Chunks(key, head, offsets, Pieces.of(part)).encode())
    end = End(key, EndKind.CLEAN, 9_000_000, None, "", [8_000, 8_001], Pieces.of(tail))
    out.append(end.encode())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument(
        "--answer-tokens", type=int, default=0, help="0: as the bench asks (the reply's words)"
    )
    parser.add_argument(
        "--events-per-chunk", type=int, default=2, help="events a proxy read holds (Dynamo: 1-3)"
    )
    parser.add_argument(
        "--history",
        choices=("frontend", "synthetic"),
        default="frontend",
        help="frontend: each answer as long as the reply and resent as streamed; synthetic: "
        "8-token answers, the bench's own reply resent (the multiturn regime's two cases)",
    )
    parser.add_argument(
        "--conversation-size",
        choices=tuple(SIZES),
        default="long",
        help="as the multiturn regime's",
    )
    parser.add_argument(
        "--answer-text",
        choices=("random", "words"),
        default="random",
        help="random: random token ids, as Dynamo's mocker streams; words: the bench's "
        "reply (English words) as ids, a token an event (what a model's answer looks like)",
    )
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--side", choices=("all", "request", "chunks", "end"), default="all")
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative", "none"))
    parser.add_argument(
        "--malloc",
        default=allocator.AUTO,
        help="as worker.malloc: auto (jemalloc when the machine has it, as a shard runs), "
        "system, or a library's path",
    )
    args = parser.parse_args()
    library = allocator.choose(args.malloc)
    if library != allocator.SYSTEM and allocator.ENV not in os.environ:
        # As the pool's shards run: started again with the library preloaded.
        argv = [sys.executable, "-m", "bench.worker_profile", *sys.argv[1:]]
        os.execve(sys.executable, argv, allocator.worker_env(library))
    # As the pool starts each shard (``worker/main/shards.py``): the tokenizer on one
    # thread (read when the tokenizer first runs).
    os.environ.update(RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    taps = reference_taps([f"inproc://tap{i}" for i in range(2)])
    config = Config.from_mapping(
        proxy_config("http://127.0.0.1:9", models={MODEL_NAME: str(MODEL_DIR)}, taps=taps)
    )
    models = load_models(config)
    clock = TokenizerClock(models[MODEL_NAME].backend)
    models[MODEL_NAME].prompt_encoder.tokenizer = clock
    joiner = Joiner(config, models, TapQueues(config.taps))
    tokenizer = models[MODEL_NAME].backend
    rng = random.Random(1)
    vocab = tokenizer.get_vocab_size()
    exchanges = []
    n = events = 0
    for index, talk in enumerate(
        conversations(args.conversations, seed=0, size=SIZES[args.conversation_size])
    ):
        history: list[dict[str, Any]] = [{"role": "system", "content": talk.system}]
        for user, reply in talk.turns:
            history.append({"role": "user", "content": user})
            synthetic = args.history == "synthetic"
            tokens = args.answer_tokens or (8 if synthetic else len(reply.split()))
            if args.answer_text == "words":
                ids = tokenizer.encode(reply, add_special_tokens=False).ids[:tokens]
            else:
                ids = [rng.randrange(1000, vocab - 1000) for _ in range(tokens)]
            pieces = [tokenizer.decode([i]) for i in ids]
            events += len(pieces) + 2
            body = {
                "model": MODEL_NAME,
                "messages": list(history),
                "max_tokens": tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            n += 1
            stream = dynamo_stream(pieces, 1000)
            exchanges.append(messages_for(n, body, stream, args.events_per_chunk, f"conv-{index}"))
            history.append(
                {"role": "assistant", "content": reply if synthetic else "".join(pieces)}
            )
    sides = {"request": 0.0, "chunks": 0.0, "end": 0.0}
    encoded = {"request": 0.0, "chunks": 0.0, "end": 0.0}
    profiler = cProfile.Profile()
    profile = args.sort != "none"
    for frames_list in exchanges:
        for i, frames in enumerate(frames_list):
            side = "request" if i == 0 else "end" if i == len(frames_list) - 1 else "chunks"
            on = profile and args.side in ("all", side)
            started, tokenizer_before = time.thread_time(), clock.seconds
            if on:
                profiler.enable()
            joiner.handle(messages.decode_for_shard(frames))  # type: ignore[arg-type]
            if on:
                profiler.disable()
            sides[side] += time.thread_time() - started
            encoded[side] += clock.seconds - tokenizer_before
    requests = len(exchanges)
    per = {k: 1000 * v / requests for k, v in sides.items()}
    print(
        f"{requests} requests, {args.answer_text} answers; CPU per request"
        + f" (ms{', profiled' if profile else ''}): "
        + ", ".join(f"{k} {v:.2f}" for k, v in per.items())
        + f"; chunks per event {1e6 * sides['chunks'] / events:.2f} µs"
        + f" ({events / requests:.0f} events per request);"
        + f" tokenizer {1000 * clock.seconds / requests:.2f} ms of it"
        + f" (prompt {1000 * encoded['request'] / requests:.2f}, answer"
        + f" {1000 * encoded['end'] / requests:.2f}); CPU / tokenizer"
        + f" {sum(sides.values()) / max(clock.seconds, 1e-9):.2f}; malloc {allocator.in_use()}"
    )
    if profile:
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
