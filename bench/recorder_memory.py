"""Memory retained by one ResponseRecorder, measured with tracemalloc.

Run from the repository root: .venv/bin/python bench/recorder_memory.py
"""

import json
import time
import tracemalloc

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.response.recorder import ResponseRecorder

WORDS = ["the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ".", " Über", " 🙂"]


def stream(tokens: int, n: int, ids: bool) -> list[bytes]:
    """An OpenAI chat stream: one token per chunk per choice, vLLM-style ids if asked,
    cut into 4 KiB network reads."""
    events = []
    for t in range(tokens):
        for i in range(n):
            choice = {
                "index": i,
                "delta": {"content": WORDS[(t + i) % len(WORDS)]},
                "logprobs": None,
                "finish_reason": "stop" if t == tokens - 1 else None,
            }
            if ids:
                choice["token_ids"] = [1000 + (t * 7 + i) % 150000]
            obj = {
                "id": "chatcmpl-0123456789abcdef",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "choices": [choice],
            }
            events.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
    events.append(
        b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":%d}}\n\n'
        % (tokens * n)
    )
    events.append(b"data: [DONE]\n\n")
    raw = b"".join(events)
    return [raw[i : i + 4096] for i in range(0, len(raw), 4096)], len(raw)


def measure(tokens, n, ids, keep_ids, timing):
    chunks, size = stream(tokens, n, ids)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    rec = ResponseRecorder(Route.CHAT, n, chunk_timing=timing, max_token_ids_per_choice=keep_ids)
    rec.head(200, "text/event-stream", "", 0)
    for k, c in enumerate(chunks):
        rec.feed(c, k)
    elapsed = time.perf_counter() - t0
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    obs = rec.finish(EndKind.CLEAN, len(chunks))
    assert obs.outcome == "complete", obs.outcome
    kept_kib, peak_kib = (retained - base) / 2**10, (peak - base) / 2**10
    per_event_us = elapsed / (tokens * n) * 1e6
    print(
        f"tokens/choice={tokens:6d} n={n} upstream_ids={ids!s:5} keep_ids={keep_ids!s:5} "
        f"chunk_timing={timing!s:5} body={size / 2**20:6.2f} MiB  retained={kept_kib:8.1f} KiB "
        f"peak={peak_kib:8.1f} KiB  feed={elapsed * 1e3:6.0f} ms ({per_event_us:.1f} us/event)"
    )


for tokens, n in [(20000, 1), (20000, 4)]:
    for ids, keep in [(False, None), (True, None), (True, 256)]:
        for timing in (False, True):
            measure(tokens, n, ids, keep, timing)
