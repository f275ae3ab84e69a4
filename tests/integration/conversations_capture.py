"""Multi-turn conversations with think times, captured through the proxy for the
closed-loop tests (``capture_conversations``). No pytest fixtures here."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from shadow_proxy.devtools.processes import reserve_port, wait_until
from tests.integration.replay_capture import Consumer
from tests.support.servers import proxy_config, run_proxy

#: Per conversation, the think time before each later turn.
THINKS_S = ((0.2, 0.5), (0.8, 0.3), (1.2, 0.4))
MAX_TOKENS = 8


def messages(conversation: int, answers: list[str]) -> list[dict[str, str]]:
    out = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": f"Conversation {conversation}: where do we start?"},
    ]
    for k, answer in enumerate(answers):
        out += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"And step {k + 1}?"},
        ]
    return out


async def answer_of(resp: aiohttp.ClientResponse) -> str:
    text = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


async def converse(session: aiohttp.ClientSession, url: str, model: str, c: int) -> None:
    answers: list[str] = []
    headers = {"x-dynamo-session-id": "conversation-0"} if c == 0 else {}
    for k in range(len(THINKS_S[c]) + 1):
        body = {
            "model": model,
            "messages": messages(c, answers),
            "max_tokens": MAX_TOKENS,
            "stream": True,
        }
        async with session.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={**headers, "x-request-id": f"c{c}-t{k}"},
        ) as resp:
            assert resp.status == 200, await resp.text()
            answers.append(await answer_of(resp))
        if k < len(THINKS_S[c]):
            await asyncio.sleep(THINKS_S[c][k])  # the client's think time, recorded


async def capture_conversations(upstream: str, model: str, tokenizer: Path, out: Path) -> Path:
    """The ``THINKS_S`` conversations, run at once through a proxy (one joined
    tap, ``shadow-consumer --record``) in front of ``upstream``; returns the
    record set's directory once every turn's record is in it."""
    endpoint = f"tcp://127.0.0.1:{reserve_port()}"
    tap = {"name": "joined", "topic": "joined", "capture": "request_response"}
    taps = [{**tap, "emit": "joined", "endpoint": endpoint, "capacity": 1024}]
    models = [{"name": model, "tokenizer": str(tokenizer)}]
    config = proxy_config(upstream, models=models, taps=taps)
    consumer = Consumer(endpoint, "joined", out, 1 << 30)
    turns = sum(len(t) + 1 for t in THINKS_S)
    try:
        async with run_proxy(config) as (url, _registry, _app):
            await wait_until(lambda: consumer.read().get("heartbeats", 0) >= 1, timeout=15)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                conversations = (converse(session, url, model, c) for c in range(len(THINKS_S)))
                await asyncio.gather(*conversations)
            await wait_until(lambda: consumer.read().get("records") == turns, timeout=30)
    finally:
        consumer.close()
    return consumer.records
