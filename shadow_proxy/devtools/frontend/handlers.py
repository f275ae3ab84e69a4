"""The built-in frontend's routes: models, health, stats and generation.

One ``Handlers`` per app (``app.py``). A generation request runs
``_generate`` once: read and validate (``generation.read_request``), count the
prompts (cached, else encoded in a small thread pool so the loop keeps
streaming), plan, then stream SSE events or answer unary, pacing with
``ttft_ms`` and ``itl_ms``. Guarantees: every request started is counted
exactly once more in ``MockStats``: completed, cancelled (the client went
away: the generation stops at once), failed (a fault ended it) or rejected
(invalid); ``in_flight`` is back to what it was when the handler returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import attrs
from aiohttp import web

from shadow_proxy.devtools.frontend.config import (
    FAULT_HEADER,
    Faults,
    MockConfig,
    MockRequestError,
)
from shadow_proxy.devtools.frontend.generation import (
    DONE_EVENT,
    ERROR_EVENT,
    ChunkEncoder,
    Generation,
    error_body,
    gzip_bomb,
    plan,
    read_request,
    unary_body,
)
from shadow_proxy.devtools.frontend.models import ServedModel

REQUEST_ID_HEADER = "x-request-id"
#: What shadow-replay sends beside its own ``{id}-candidate`` request id.
ORIGINAL_REQUEST_ID_HEADER = "x-shadow-original-request-id"


@attrs.define
class MockStats:
    """What the mock did; served at ``GET /mock/stats``."""

    requests_started: int = 0
    requests_completed: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0
    tokens_generated: int = 0
    in_flight: int = 0


class Handlers:
    """The routes; one instance per app."""

    def __init__(
        self,
        config: MockConfig,
        models: Mapping[str, ServedModel],
        stats: MockStats,
        pool: ThreadPoolExecutor | None,
    ) -> None:
        self.pool = pool
        self.config = config
        self.models = dict(models)
        self.stats = stats
        self.ttft_s = config.ttft_ms / 1000
        self.itl_s = config.itl_ms / 1000
        self.created = int(time.time())

    async def health(self, _request: web.Request) -> web.Response:
        """``GET /health``: the process is up."""
        return web.json_response({"status": "ok"})

    async def list_models(self, _request: web.Request) -> web.Response:
        """``GET /v1/models``: every served model, with its context length when known."""
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "shadow-proxy-mock",
                **({"max_model_len": m.context_length} if m.context_length else {}),
            }
            for name, m in self.models.items()
        ]
        return web.json_response({"object": "list", "data": data})

    async def get_stats(self, _request: web.Request) -> web.Response:
        """``GET /mock/stats``: the counters (``MockStats``) as they are now."""
        return web.json_response(attrs.asdict(self.stats))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (see ``_generate``)."""
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions`` (see ``_generate``)."""
        return await self._generate(request, chat=False)

    def _headers(self, request: web.Request) -> dict[str, str]:
        request_id = request.headers.get(REQUEST_ID_HEADER)
        return {REQUEST_ID_HEADER: request_id} if request_id else {}

    def _error(
        self, request: web.Request, status: int, message: str, kind: str, code: object
    ) -> web.Response:
        return web.json_response(
            error_body(message, kind, code), status=status, headers=self._headers(request)
        )

    async def _count(self, model: ServedModel, prompts: list[str | int]) -> list[int]:
        """Token counts of prompts: cached, else encoded in the pool."""
        counts = []
        for prompt in prompts:
            if isinstance(prompt, int):
                counts.append(prompt)
                continue
            count = model.cached_count(prompt)
            if count is None:
                if self.pool is None:
                    count = model.encode_count(prompt)
                else:
                    loop = asyncio.get_running_loop()
                    count = await loop.run_in_executor(self.pool, model.encode_count, prompt)
                model.remember_count(prompt, count)
            counts.append(count)
        return counts

    async def _plan(self, request: web.Request, raw: bytes, chat: bool) -> Generation:
        """Validate the request, count its prompts and decide what to generate.
        Raises ``MockRequestError`` for anything a real frontend would reject."""
        accepted = read_request(
            raw,
            request.headers.get(FAULT_HEADER),
            chat=chat,
            models=self.models,
            default_max_tokens=self.config.default_max_tokens,
            # A replayed request carries its record's id beside its own: a
            # candidate diverges on the same records as the primary would.
            request_id=request.headers.get(ORIGINAL_REQUEST_ID_HEADER)
            or request.headers.get(REQUEST_ID_HEADER),
        )
        counts = await self._count(accepted.model, accepted.prompts)
        config = self.config
        return plan(
            accepted,
            counts,
            diverge_fraction=config.diverge_fraction,
            diverge_at=config.diverge_at,
        )

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """Runs once per generation request. Every request started is counted
        exactly once more: completed, cancelled (the client went away),
        failed (a fault ended it) or rejected (invalid)."""
        stats = self.stats
        stats.requests_started += 1
        stats.in_flight += 1
        try:
            raw = await request.read()
            try:
                # A status in the header is answered before the body is parsed (as a
                # frontend's size limit answers): a huge body costs the mock nothing.
                faults = Faults.parse(request.headers.get(FAULT_HEADER))
                gen = None if faults.status is not None else await self._plan(request, raw, chat)
            except MockRequestError as exc:
                stats.requests_rejected += 1
                kind = "invalid_request_error"
                return self._error(request, exc.status, str(exc), kind, exc.code or exc.status)
            if gen is None or gen.faults.status is not None:
                stats.requests_failed += 1
                status = faults.status if gen is None else gen.faults.status
                assert status is not None  # a fault status, or no plan was made
                message = f"mock fault: status {status}"
                return self._error(request, status, message, "server_error", status)
            if gen.stream:
                return await self._stream(request, gen)
            return await self._unary(request, gen)
        except asyncio.CancelledError:
            stats.requests_cancelled += 1
            raise
        finally:
            stats.in_flight -= 1

    async def _hang(self, request: web.Request) -> None:
        """Wait until the client goes away (cancellation, or the transport closing
        when the server runs without handler cancellation)."""
        # Polling, not an Event: aiohttp has no public connection-lost hook.
        while (transport := request.transport) is not None and not transport.is_closing():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        self.stats.requests_cancelled += 1

    def _drop(self, request: web.Request) -> None:
        if request.transport is not None:
            request.transport.abort()
        self.stats.requests_failed += 1

    async def _event_stream(self, request: web.Request) -> web.StreamResponse:
        """An SSE response with its headers sent (chat, completions, Responses)."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        resp = web.StreamResponse(headers={**headers, **self._headers(request)})
        await resp.prepare(request)
        return resp

    async def _stream(self, request: web.Request, gen: Generation) -> web.StreamResponse:
        if gen.faults.gzip_bomb_mib is not None:
            return await self._bomb(request, gen.faults.gzip_bomb_mib)
        resp = await self._event_stream(request)
        if gen.faults.hang:
            await self._hang(request)
            return resp
        encoder = ChunkEncoder(gen)
        stats = self.stats
        length = gen.tokens_per_choice
        stop_step = gen.faults.stop_step(gen.tokens_per_choice)
        try:
            if self.ttft_s:
                await asyncio.sleep(self.ttft_s)
            for step in range(length + 1):
                if step == stop_step:
                    if gen.faults.drop_after == step:
                        self._drop(request)
                        return resp
                    await resp.write(ERROR_EVENT)
                    stats.requests_failed += 1
                    return resp
                if step == length:
                    break
                if step and self.itl_s:
                    await asyncio.sleep(self.itl_s)
                last = step == length - 1
                for index in range(gen.choices):
                    finish = gen.finish_for(index) if last else None
                    await resp.write(encoder.token(index, step, finish))
                stats.tokens_generated += gen.choices
            if gen.include_usage:
                await resp.write(encoder.usage())
            await resp.write(DONE_EVENT)
            await resp.write_eof()
        except ConnectionResetError:
            stats.requests_cancelled += 1
            return resp
        stats.requests_completed += 1
        return resp

    async def _bomb(self, request: web.Request, mib: int) -> web.StreamResponse:
        """``gzip-bomb=MIB``: the bomb in 64 KiB writes, labelled ``Content-Encoding: gzip``."""
        body = gzip_bomb(mib)
        headers = {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
        resp = web.StreamResponse(headers={**headers, **self._headers(request)})
        await resp.prepare(request)
        try:
            for start in range(0, len(body), 64 << 10):
                await resp.write(body[start : start + (64 << 10)])
            await resp.write_eof()
        except ConnectionResetError:
            self.stats.requests_cancelled += 1
            return resp
        self.stats.requests_completed += 1
        return resp

    async def _unary(self, request: web.Request, gen: Generation) -> web.StreamResponse:
        if gen.faults.hang:
            await self._hang(request)
            return web.Response(status=499)
        stats = self.stats
        stop_step = gen.faults.stop_step(gen.tokens_per_choice)
        if self.ttft_s:
            await asyncio.sleep(self.ttft_s)
        for step in range(gen.tokens_per_choice + 1):
            if step == stop_step:
                if gen.faults.drop_after == step:
                    self._drop(request)
                    return web.Response(status=499)
                stats.requests_failed += 1
                return self._error(request, 500, "worker died", "internal_error", 500)
            if step == gen.tokens_per_choice:
                break
            if step and self.itl_s:
                await asyncio.sleep(self.itl_s)
            stats.tokens_generated += gen.choices
        stats.requests_completed += 1
        return web.json_response(unary_body(gen), headers=self._headers(request))
