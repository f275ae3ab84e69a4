"""What one accepted request generates, and its bytes.

``read_request`` runs once per generation request, before anything is sent:
it validates the body as a real frontend would (``MockRequestError``
otherwise) and says what to count; ``plan`` turns the counted prompts into a
``Generation``. ``ChunkEncoder`` builds each SSE event from pre-encoded pieces
(a few concatenations per chunk, no ``json.dumps``); ``unary_body`` is the
whole non-streamed answer. Guarantees: the output is deterministic (every
choice cycles over the model's output tokens), ``usage`` counts exactly the
prompt and the tokens generated, and ``n`` choices interleave chunk by chunk.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
import zlib
from collections.abc import Mapping
from typing import Any

import attrs

from shadow_proxy.devtools.frontend.config import (
    FAULT_FIELD,
    Faults,
    MockRequestError,
    diverges,
)
from shadow_proxy.devtools.frontend.models import ServedModel

MAX_CHOICES = 128
ERROR_EVENT = (
    b'data: {"error": {"message": "worker died", "type": "internal_error", "code": 500}}\n\n'
)
DONE_EVENT = b"data: [DONE]\n\n"


@functools.cache
def gzip_bomb(mib: int) -> bytes:
    """A gzip body of chat chunks that decodes to ``mib`` MiB (about 1,000 times
    its size), made once per size."""
    event = b'data: {"id":"bomb","choices":[{"index":0,"delta":{"content":"aaaaaaaa"}}]}\n\n'
    block = event * ((64 << 10) // len(event))
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [compressor.compress(block) for _ in range((mib << 20) // len(block) + 1)]
    parts.append(compressor.compress(DONE_EVENT) + compressor.flush())
    return b"".join(parts)


@attrs.frozen
class Request:
    """A generation request that passed validation; its prompts still to count."""

    chat: bool
    body: dict[str, Any]
    faults: Faults
    model: ServedModel
    n: int
    max_tokens: int
    #: One per prompt: a text to encode, or the length of a token-id prompt.
    prompts: list[str | int]
    #: The client's ``x-request-id`` (divergence is decided by it).
    request_id: str | None = None


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object; ``MockRequestError`` otherwise."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"request body is not valid JSON: {exc}"
        raise MockRequestError(msg) from exc
    if not isinstance(body, dict):
        msg = "request body must be a JSON object"
        raise MockRequestError(msg)
    return body


def read_request(
    raw: bytes,
    fault_header: str | None,
    *,
    chat: bool,
    models: Mapping[str, ServedModel],
    default_max_tokens: int,
    request_id: str | None = None,
) -> Request:
    """Validate a request body; raises ``MockRequestError`` for anything a real
    frontend would reject (bad JSON, unknown model, bad counts, a template
    that fails, an unknown fault)."""
    body = json_object(raw)
    fault_text = fault_header or body.get(FAULT_FIELD)
    faults = Faults.parse(fault_text if isinstance(fault_text, str) else None)
    name = body.get("model")
    if not isinstance(name, str):
        msg = "'model' must be a string"
        raise MockRequestError(msg)
    model = models.get(name)
    if model is None:
        msg = f"The model '{name}' does not exist."
        raise MockRequestError(msg, status=404, code="model_not_found")
    n = _int_field(body, "n", 1) or 1
    if n > MAX_CHOICES:
        msg = f"'n' must be at most {MAX_CHOICES} (got {n})"
        raise MockRequestError(msg)
    max_tokens = _int_field(body, "max_completion_tokens", None) or _int_field(
        body, "max_tokens", default_max_tokens
    )
    assert max_tokens is not None
    if chat:
        prompts: list[str | int] = [model.chat_prompt_text(body)]
    else:
        prompts = model.completion_prompts(body.get("prompt"))
    return Request(chat, body, faults, model, n, max_tokens, prompts, request_id)


def plan(
    request: Request,
    prompt_tokens: list[int],
    *,
    diverge_fraction: float = 0.0,
    diverge_at: int = 0,
) -> Generation:
    """What to generate for ``request`` whose prompts count ``prompt_tokens``
    (one per prompt); ``MockRequestError`` when they do not fit the context.
    With ``diverge_fraction``, a request whose id (the client's, else the
    response's) ``diverges`` skips one output token from ``diverge_at`` on."""
    model, max_tokens = request.model, request.max_tokens
    longest = max(prompt_tokens)
    if model.context_length is not None and longest + max_tokens > model.context_length:
        msg = (
            f"This model's maximum context length is {model.context_length} tokens. "
            f"However, you requested {longest + max_tokens} tokens "
            f"({longest} in the messages, {max_tokens} in the completion)."
        )
        raise MockRequestError(msg)
    body, faults = request.body, request.faults
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    stop_after = faults.stop_after
    early_stop = stop_after is not None and stop_after < max_tokens
    prefix = "chatcmpl" if request.chat else "cmpl"
    response_id = f"{prefix}-{uuid.uuid4().hex}"
    diverge = diverge_fraction > 0 and diverges(request.request_id or response_id, diverge_fraction)
    return Generation(
        chat=request.chat,
        stream=stream,
        model=model,
        response_id=response_id,
        created=int(time.time()),
        choices=request.n * len(prompt_tokens),
        tokens_per_choice=stop_after if early_stop and stop_after is not None else max_tokens,
        finish_reason="stop" if early_stop else "length",
        prompt_tokens=sum(prompt_tokens),
        include_usage=include_usage,
        faults=faults,
        diverge_at=diverge_at if diverge else None,
    )


@attrs.frozen
class Generation:
    """One accepted request: what to generate and how to frame it."""

    chat: bool
    stream: bool
    model: ServedModel
    response_id: str
    created: int
    choices: int
    tokens_per_choice: int
    finish_reason: str
    prompt_tokens: int
    include_usage: bool
    faults: Faults
    #: Token position from which the output skips one token (None: it does not).
    diverge_at: int | None = None

    @property
    def usage(self) -> dict[str, int]:
        completion = self.choices * self.tokens_per_choice
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def finish_for(self, index: int) -> str | None:
        """The finish reason of choice ``index`` (None for the one a fault leaves unfinished)."""
        return None if index == self.faults.unfinished_choice else self.finish_reason


class ChunkEncoder:
    """Builds the SSE events of one stream from pre-encoded byte pieces, so a
    chunk costs a few concatenations instead of a ``json.dumps``."""

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        kind = "chat.completion.chunk" if gen.chat else "text_completion"
        self.head = (
            f'data: {{"id":"{gen.response_id}","object":"{kind}","created":{gen.created},'
            f'"model":{gen.model.name_json},"choices":[{{"index":'
        ).encode()
        self.index = [str(i).encode() for i in range(gen.choices)]
        if gen.chat:
            self.first = b',"delta":{"role":"assistant","content":'
            self.later = b',"delta":{"content":'
            self.after_text = b'},"logprobs":null,"finish_reason":'
        else:
            self.first = self.later = b',"text":'
            self.after_text = b',"logprobs":null,"finish_reason":'

    def token(self, index: int, step: int, finish: str | None) -> bytes:
        """The SSE event of choice ``index`` at ``step`` (the first carries the role)."""
        texts = self.gen.model.output_json
        return b"".join(
            (
                self.head,
                self.index[index],
                self.first if step == 0 else self.later,
                texts[self._step(step) % len(texts)],
                self.after_text,
                b"null" if finish is None else b'"' + finish.encode() + b'"',
                b"}]}\n\n",
            )
        )

    def _step(self, step: int) -> int:
        at = self.gen.diverge_at
        return step + 1 if at is not None and step >= at else step

    def usage(self) -> bytes:
        gen = self.gen
        kind = "chat.completion.chunk" if gen.chat else "text_completion"
        event = {
            "id": gen.response_id,
            "object": kind,
            "created": gen.created,
            "model": gen.model.name,
            "choices": [],
            "usage": gen.usage,
        }
        return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def unary_body(gen: Generation) -> dict[str, Any]:
    """The whole answer of a non-streaming request."""
    text = gen.model.output_text(gen.tokens_per_choice, gen.diverge_at)
    choices: list[dict[str, Any]] = []
    for index in range(gen.choices):
        choice: dict[str, Any] = {"index": index}
        if gen.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = gen.finish_for(index)
        choices.append(choice)
    return {
        "id": gen.response_id,
        "object": "chat.completion" if gen.chat else "text_completion",
        "created": gen.created,
        "model": gen.model.name,
        "choices": choices,
        "usage": gen.usage,
    }


def error_body(message: str, kind: str, code: object) -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _int_field(body: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        msg = f"'{name}' must be an integer of at least 1 (got {value!r})"
        raise MockRequestError(msg)
    return value
