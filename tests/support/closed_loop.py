"""A candidate for the closed-loop tests (``serve_candidate``): a real server on
loopback that answers each completions request with a text of its own (naming
the request's place in its arrival order) after ``delay_s``, and notes when
each request came, what prompt and original request id it held, and when its
answer ended."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from shadow_proxy.replay.request import ORIGINAL_REQUEST_ID_HEADER


class Candidate:
    """Answers "Candidate answer N, longer than the primary's." (N from 1)."""

    def __init__(self, model: str, delay_s: float = 0.05) -> None:
        self.model = model
        self.delay_s = delay_s
        self.seen: list[dict[str, Any]] = []

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model}]})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        came = time.monotonic_ns()
        body = await request.json()
        entry: dict[str, Any] = {
            "came": came,
            "prompt": body["prompt"],
            "original_id": request.headers.get(ORIGINAL_REQUEST_ID_HEADER),
        }
        self.seen.append(entry)
        text = f"Candidate answer {len(self.seen)}, longer than the primary's."
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(self.delay_s)
        for chunk in (text[:10], text[10:]):
            event = {"id": "c", "choices": [{"index": 0, "text": chunk}]}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        done = {"id": "c", "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}
        # Stamped before the last event is written: the client cannot see the
        # answer end before ``ended``, so a later turn's gap is never short.
        entry["ended"] = time.monotonic_ns()
        entry["answer"] = text
        await response.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    def by_original_id(self) -> dict[str, dict[str, Any]]:
        return {entry["original_id"]: entry for entry in self.seen}


@contextlib.asynccontextmanager
async def serve_candidate(
    model: str, delay_s: float = 0.05
) -> AsyncIterator[tuple[str, Candidate]]:
    """The candidate's base URL and the candidate, until the block ends."""
    fake = Candidate(model, delay_s)
    app = web.Application()
    app.router.add_get("/v1/models", fake.models)
    app.router.add_post("/v1/completions", fake.complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", fake
    finally:
        await runner.cleanup()
