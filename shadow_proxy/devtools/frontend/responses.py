"""``POST /v1/responses`` for the built-in frontend, shaped like Dynamo 1.6.1.

The request is turned into its chat form by the proxy's own converter
(``worker/request/responses.py``) and rendered with the model's chat template
for ``usage.input_tokens``: this frontend is a plumbing double for tests, the
demo and benchmarks, not a fidelity oracle (the real Dynamo tests are). Like
1.6.1, ``previous_response_id``, ``prompt``, ``max_tool_calls`` and
``background: true`` get 501, and what the converter refuses gets 400.

Answers, as 1.6.1 frames them (``event: TYPE`` then ``data``, a
``sequence_number`` per event, ``data: [DONE]`` at the end): ``response.created``,
``response.in_progress``, one message item (``output_item.added``,
``content_part.added``, one ``output_text.delta`` per token, the ``.done``
events), then ``response.incomplete`` (``max_output_tokens`` reached) or
``response.completed`` (the ``stop-after`` fault); the unary answer is the
final response object. Faults (``config.Faults``): ``status``, ``hang``,
``drop-after=K``, ``error-event-after=K`` (``response.failed`` after K tokens,
as 1.6.1 reports an engine error after the 200), ``stop-after=K``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import attrs
from aiohttp import web

from shadow_proxy.devtools.frontend.config import (
    FAULT_FIELD,
    FAULT_HEADER,
    Faults,
    MockRequestError,
)
from shadow_proxy.devtools.frontend.generation import _int_field, json_object
from shadow_proxy.devtools.frontend.models import ServedModel
from shadow_proxy.worker.request.fields import Reject
from shadow_proxy.worker.request.responses import chat_request

if TYPE_CHECKING:
    from shadow_proxy.devtools.frontend.handlers import Handlers

#: Fields 1.6.1 answers with 501 (``background`` only when true).
NOT_IMPLEMENTED = ("previous_response_id", "prompt", "max_tool_calls")


@attrs.frozen
class Reply:
    """One accepted Responses request: what to generate and how to frame it."""

    model: ServedModel
    stream: bool
    response_id: str
    message_id: str
    created: int
    tokens: int
    completed: bool  # ended by the engine (stop), not by max_output_tokens
    input_tokens: int
    echo: dict[str, Any]  # request fields the response object repeats
    faults: Faults

    def response(self, status: str, text: str | None, produced: int) -> dict[str, Any]:
        """The response object at ``status``; ``text`` None: no output yet."""
        output = []
        if text is not None:
            item_status = {"completed": "completed", "in_progress": "in_progress"}
            output.append(
                {
                    "type": "message",
                    "id": self.message_id,
                    "role": "assistant",
                    "status": item_status.get(status, "incomplete"),
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        final = status in ("completed", "incomplete")
        usage = None
        if final:
            usage = {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": produced,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + produced,
            }
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "error": None,
            "model": self.model.name,
            "output": output,
            "usage": usage,
            **self.echo,
        }


class ResponsesHandler:
    """The ``/v1/responses`` route of one built-in frontend app; it shares the
    app's models, stats, pacing and prompt-count cache (``handlers.Handlers``)."""

    def __init__(self, handlers: Handlers) -> None:
        self.h = handlers

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Runs once per request; counted once as completed, cancelled, failed or
        rejected, as the chat and completions routes are."""
        stats = self.h.stats
        stats.requests_started += 1
        stats.in_flight += 1
        try:
            try:
                reply = await self._plan(request, await request.read())
            except MockRequestError as exc:
                stats.requests_rejected += 1
                return web.json_response(
                    {"message": str(exc), "type": "Bad Request", "code": exc.status},
                    status=exc.status,
                    headers=self.h._headers(request),
                )
            if reply.faults.status is not None:
                stats.requests_failed += 1
                status = reply.faults.status
                body = {"message": f"mock fault: status {status}", "code": status}
                return web.json_response(body, status=status, headers=self.h._headers(request))
            if reply.stream:
                return await self._stream(request, reply)
            return await self._unary(request, reply)
        except asyncio.CancelledError:
            stats.requests_cancelled += 1
            raise
        finally:
            stats.in_flight -= 1

    async def _plan(self, request: web.Request, raw: bytes) -> Reply:
        body = json_object(raw)
        fault_text = request.headers.get(FAULT_HEADER) or body.get(FAULT_FIELD)
        faults = Faults.parse(fault_text if isinstance(fault_text, str) else None)
        name = body.get("model")
        model = self.h.models.get(name) if isinstance(name, str) else None
        if model is None:
            raise MockRequestError("Model not found", status=404)
        for key in NOT_IMPLEMENTED:
            if body.get(key) is not None:
                raise MockRequestError(f"Validation: `{key}` is not supported.", status=501)
        if body.get("background") is True:
            raise MockRequestError("Validation: `background: true` is not supported.", 501)
        try:
            chat = chat_request(body)
        except Reject as reject:
            msg = f"Failed to convert responses request ({reject.reason})"
            raise MockRequestError(msg) from None
        if chat.get("tool_choice") == "none":
            chat.pop("tools", None)  # as the chat rule: tools left out of the prompt
        max_tokens = _int_field(body, "max_output_tokens", self.h.config.default_max_tokens)
        assert max_tokens is not None
        [input_tokens] = await self.h._count(model, [model.chat_prompt_text(chat)])
        stop_after = faults.stop_after
        completed = stop_after is not None and stop_after < max_tokens
        echo = {
            key: body.get(key)
            for key in ("instructions", "max_output_tokens", "metadata", "temperature", "top_p")
        }
        echo["tools"] = body.get("tools") or []
        echo["tool_choice"] = body.get("tool_choice") or "auto"
        return Reply(
            model=model,
            stream=body.get("stream") is True,
            response_id=f"resp_{uuid.uuid4().hex}",
            message_id=f"msg_{uuid.uuid4().hex}",
            created=int(time.time()),
            tokens=stop_after if completed and stop_after is not None else max_tokens,
            completed=completed,
            input_tokens=input_tokens,
            echo=echo,
            faults=faults,
        )

    async def _stream(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        resp = await self.h._event_stream(request)
        if reply.faults.hang:
            await self.h._hang(request)
            return resp
        events = _Events(resp)
        stats = self.h.stats
        stop_step = reply.faults.stop_step(reply.tokens)
        text = ""
        item = {"item_id": reply.message_id, "output_index": 0, "content_index": 0}
        try:
            await events.send("response.created", response=reply.response("in_progress", None, 0))
            await events.send(
                "response.in_progress", response=reply.response("in_progress", None, 0)
            )
            if self.h.ttft_s:
                await asyncio.sleep(self.h.ttft_s)
            for step in range(reply.tokens + 1):
                if step == stop_step:
                    if reply.faults.drop_after == step:
                        self.h._drop(request)
                        return resp
                    failed = reply.response("failed", None, step)
                    failed["error"] = {"code": "server_error", "message": "worker died"}
                    await events.send("response.failed", response=failed)
                    await events.done()
                    stats.requests_failed += 1
                    return resp
                if step == reply.tokens:
                    break
                if step == 0:
                    message = reply.response("in_progress", "", 0)["output"][0]
                    await events.send(
                        "response.output_item.added", output_index=0, item={**message}
                    )
                    part = {"type": "output_text", "text": "", "annotations": []}
                    await events.send("response.content_part.added", **item, part=part)
                elif self.h.itl_s:
                    await asyncio.sleep(self.h.itl_s)
                piece = reply.model.output_texts[step % len(reply.model.output_texts)]
                text += piece
                await events.send("response.output_text.delta", **item, delta=piece)
                stats.tokens_generated += 1
            status = "completed" if reply.completed else "incomplete"
            if reply.tokens:
                done = reply.response(status, text, reply.tokens)["output"][0]
                await events.send("response.output_text.done", **item, text=text)
                await events.send("response.content_part.done", **item, part=done["content"][0])
                await events.send("response.output_item.done", output_index=0, item=done)
            final = reply.response(status, text or None, reply.tokens)
            await events.send(f"response.{status}", response=final)
            await events.done()
        except ConnectionResetError:
            stats.requests_cancelled += 1
            return resp
        stats.requests_completed += 1
        return resp

    async def _unary(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        if reply.faults.hang:
            await self.h._hang(request)
            return web.Response(status=499)
        stats = self.h.stats
        stop_step = reply.faults.stop_step(reply.tokens)
        if self.h.ttft_s:
            await asyncio.sleep(self.h.ttft_s)
        for step in range(reply.tokens + 1):
            if step == stop_step:
                if reply.faults.drop_after == step:
                    self.h._drop(request)
                    return web.Response(status=499)
                stats.requests_failed += 1
                failed = reply.response("failed", None, step)
                failed["error"] = {"code": "server_error", "message": "worker died"}
                return web.json_response(failed, headers=self.h._headers(request))
            if step == reply.tokens:
                break
            if step and self.h.itl_s:
                await asyncio.sleep(self.h.itl_s)
            stats.tokens_generated += 1
        stats.requests_completed += 1
        status = "completed" if reply.completed else "incomplete"
        text = reply.model.output_text(reply.tokens)
        body = reply.response(status, text if reply.tokens else None, reply.tokens)
        return web.json_response(body, headers=self.h._headers(request))


class _Events:
    """Writes one stream's typed events, numbering them."""

    def __init__(self, resp: web.StreamResponse) -> None:
        self.resp = resp
        self.sequence = 0

    async def send(self, kind: str, **fields: Any) -> None:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        await self.resp.write(f"event: {kind}\ndata: {payload}\n\n".encode())

    async def done(self) -> None:
        await self.resp.write(b"data: [DONE]\n\n")
        await self.resp.write_eof()
