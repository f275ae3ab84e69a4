"""Helpers for the built-in frontend's tests: a conversation, its stats, faults, SSE bodies."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from shadow_proxy.devtools.frontend import (
    STATS_KEY,
)

MODEL_NAMES = ("deepseek", "chatml")


HELLO = [{"role": "user", "content": "Hello there, how are you?"}]


Server = tuple[str, web.Application]


def stats_of(server: Server) -> dict[str, int]:
    stats = server[1][STATS_KEY]
    return {
        "started": stats.requests_started,
        "completed": stats.requests_completed,
        "cancelled": stats.requests_cancelled,
        "failed": stats.requests_failed,
        "rejected": stats.requests_rejected,
        "tokens": stats.tokens_generated,
        "in_flight": stats.in_flight,
    }


def fault(text: str) -> dict[str, Any]:
    return {"extra_headers": {"x-mock-fault": text}}


async def sse_events(resp: aiohttp.ClientResponse) -> list[bytes]:
    """The ``data:`` payloads of an SSE body, in order."""
    body = await resp.read()
    return [e[len(b"data: ") :] for e in body.split(b"\n\n") if e]
