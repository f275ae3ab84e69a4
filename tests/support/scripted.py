"""A scripted frontend for the serving tests: records what it received, answers per path.

Paths: ``/v1/chat/completions`` streams ``SSE_EVENTS`` when the body asks for a
stream; ``/slow-stream`` sends one event then waits for ``release``;
``/gzip``, ``/big``, ``/echo``, ``/status?code=N``, ``/hop`` (hop-by-hop
headers); ``/break-before`` resets the connection before answering,
``/break-mid`` after a first event, once ``break_now`` is set. The waits are
events the test sets, never sleeps, so a loaded machine cannot reorder them.
Anything else answers a model list.
"""

from __future__ import annotations

import asyncio
import gzip
import os

from aiohttp import web
from multidict import CIMultiDict

SSE_EVENTS = [
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n',
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n',
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"lo \xf0\x9f\x98\x80"}}]}\n\n',
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


class Frontend:
    """A scripted frontend: records what it received, answers per path."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        #: ``/slow-stream``: where each cancelled handler was when it was cancelled.
        self.cancelled: list[str] = []
        #: ``/slow-stream`` sends more only once this is set.
        self.release = asyncio.Event()
        #: ``/break-mid`` resets the connection only once this is set.
        self.break_now = asyncio.Event()
        #: When set (not None), a streamed chat answer sends its first event, then
        #: waits for it before the rest.
        self.gate: asyncio.Event | None = None
        self.app = web.Application(client_max_size=256 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(
            {
                "method": request.method,
                "path": request.raw_path,
                "headers": CIMultiDict(request.headers),
                "body": body,
            }
        )
        path = request.path
        if path == "/v1/chat/completions" and b'"stream": true' in body:
            return await self.sse(request)
        if path == "/slow-stream":
            return await self.slow_stream(request)
        if path == "/gzip":
            payload = gzip.compress(b'{"hello": "world"}' * 100, mtime=0)
            return web.Response(
                body=payload,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
            )
        if path == "/big":
            return web.Response(body=os.urandom(20 * 1024 * 1024))
        if path == "/echo":
            return web.Response(body=body, headers={"X-Echo-Len": str(len(body))})
        if path == "/status":
            code = int(request.query["code"])
            return web.json_response({"error": {"message": "nope", "code": code}}, status=code)
        if path == "/hop":
            return web.Response(
                text="ok", headers={"Connection": "X-Private", "X-Private": "1", "X-Public": "2"}
            )
        if path == "/break-mid":
            # Headers and a first event, then a reset once the test says so
            # (after the client got that event: the proxy has read the headers).
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(SSE_EVENTS[0])
            await self.break_now.wait()
            assert request.transport is not None
            request.transport.abort()
            return response
        if path == "/break-before":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for i, event in enumerate(SSE_EVENTS):
            await response.write(event)
            if i == 0 and self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0.005)
        await response.write_eof()
        return response

    async def slow_stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        stage = "first"
        try:
            await response.write(b"data: first\n\n")
            stage = "waiting"
            await self.release.wait()
            stage = "streaming"
            for _ in range(1000):
                await response.write(b"data: more\n\n")
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.cancelled.append(stage)
            raise
        await response.write_eof()
        return response


async def fetch(session, method, url, **kw):
    async with session.request(method, url, **kw) as r:
        return r.status, r.headers, await r.read()
