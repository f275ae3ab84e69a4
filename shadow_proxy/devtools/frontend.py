"""A built-in OpenAI-compatible frontend for the demo, the tests and the benchmarks.

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming SSE and
unary), ``/v1/responses`` (``frontend_responses.py``), ``/v1/models`` and
``/health`` like a real frontend would, without a model:

- ``usage.prompt_tokens`` is exact: chat messages are rendered with the model's
  own chat template (generation prompt added) and the text is encoded without
  special tokens, as a Dynamo frontend does; a string prompt is encoded as it
  is, a token-id prompt is counted as it is. As in the proxy (and Dynamo), the
  encoder is tokenizer.json as written. Counts are cached per
  rendered text (at most ``PROMPT_CACHE_SIZE`` texts per model), so a benchmark
  replaying prompts pays for the tokenizer once; a miss is encoded in a small
  thread pool (the tokenizer releases the GIL), so the event loop keeps
  streaming other requests meanwhile.
- The output is deterministic: every choice cycles over the token ids of a
  fixed sentence, decoded once at start-up. ``max_completion_tokens`` or
  ``max_tokens`` (else the configured default) tokens per choice, finish reason
  ``length``; ``n`` choices are interleaved chunk by chunk.
- ``ttft_ms`` passes before the first token and ``itl_ms`` between tokens. Each
  SSE event is its own ``write()``.
- Divergence (for replay tests and the demo): with ``diverge_fraction`` above 0,
  a request whose request id (``x-request-id``, else the response id) falls in
  that fraction (``diverges``: a CRC-32 of the id) skips one token of the cycle
  from token position ``diverge_at`` on, in every choice: same token count, the
  output differs from position ``diverge_at``.

Tests steer a request with the header ``x-mock-fault`` (or the body field
``mock_fault`` when a header cannot be set): a comma-separated list of
directives, see ``Faults.parse``. ``GET /mock/stats`` returns counters that show
what the frontend did, in particular that it stopped generating when the client
went away (``handler_cancellation`` is on in every server started here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import jinja2
from aiohttp import web
from tokenizers import Tokenizer

from shadow_proxy.worker.request.tokenizer import template_environment

log = logging.getLogger(__name__)

FAULT_HEADER = "x-mock-fault"
FAULT_FIELD = "mock_fault"
REQUEST_ID_HEADER = "x-request-id"
DEFAULT_MODEL = "deepseek=.models/deepseek"
#: The output text: every choice cycles over this sentence's tokens.
OUTPUT_SENTENCE = "The quick brown fox jumps over the lazy dog, and the shadow keeps pace. "
#: Bound of the per-model prompt-count cache (entries are rendered prompt texts).
PROMPT_CACHE_SIZE = 1024
MAX_CHOICES = 128
ERROR_EVENT = (
    b'data: {"error": {"message": "worker died", "type": "internal_error", "code": 500}}\n\n'
)
DONE_EVENT = b"data: [DONE]\n\n"


class MockRequestError(ValueError):
    """A request the mock rejects; carries the HTTP status and OpenAI error fields."""

    def __init__(self, message: str, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


# --------------------------------------------------------------------------- config


def _non_negative(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if value < 0:
        msg = f"'{attribute.name}' must be at least 0 (got {value})"
        raise ValueError(msg)


def _positive(_inst: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        msg = f"'{attribute.name}' must be at least 1 (got {value})"
        raise ValueError(msg)


def _models(_inst: object, _attribute: attrs.Attribute, value: Mapping[str, Path]) -> None:
    if not value:
        msg = "'models' must name at least one model (got none)"
        raise ValueError(msg)


@attrs.frozen
class MockConfig:
    """What the mock serves and how fast. ``models`` maps a served name to a
    tokenizer directory in Hugging Face layout."""

    models: Mapping[str, Path] = attrs.field(
        converter=lambda m: {str(k): Path(v) for k, v in dict(m).items()}, validator=_models
    )
    ttft_ms: float = attrs.field(default=0.0, validator=_non_negative)
    itl_ms: float = attrs.field(default=0.0, validator=_non_negative)
    default_max_tokens: int = attrs.field(default=16, validator=_positive)
    #: Threads that encode prompts off the event loop (the tokenizer releases
    #: the GIL); 0 encodes inline on the loop.
    tokenizer_threads: int = attrs.field(default=1, validator=_non_negative)
    #: Fraction of requests (by request id, see ``diverges``) whose output
    #: differs from token position ``diverge_at`` on.
    diverge_fraction: float = attrs.field(default=0.0, validator=_non_negative)
    diverge_at: int = attrs.field(default=0, validator=_non_negative)


def diverges(request_id: str, fraction: float) -> bool:
    """Whether a request with this id diverges at ``diverge_fraction`` = fraction."""
    return zlib.crc32(request_id.encode()) < fraction * 2**32


# --------------------------------------------------------------------------- faults


def _count(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        msg = f"mock fault '{name}' needs a count of at least 0 (got {value!r})"
        raise MockRequestError(msg)
    return number


@attrs.frozen
class Faults:
    """What a request asks the mock to do wrong (or differently)."""

    #: Answer with this HTTP status and an OpenAI-style error body.
    status: int | None = None
    #: After this many tokens per choice, send an error event and end the stream.
    error_event_after: int | None = None
    #: After this many tokens per choice, abort the TCP connection.
    drop_after: int | None = None
    #: Send the headers, then nothing until the client goes away.
    hang: bool = False
    #: End the stream without a finish reason for this choice index.
    unfinished_choice: int | None = None
    #: Emit this many tokens, then finish with ``stop`` (an early EOS).
    stop_after: int | None = None

    @classmethod
    def parse(cls, text: str | None) -> Faults:
        """Parse ``status=503``, ``error-event-after=K``, ``drop-after=K``, ``hang``,
        ``unfinished-choice=I``, ``stop-after=K``, comma-separated. Unknown
        directives are errors, so a typo in a test cannot pass silently."""
        if not text:
            return NO_FAULTS
        fields: dict[str, Any] = {}
        for part in text.split(","):
            name, _, value = part.strip().partition("=")
            name = name.strip()
            value = value.strip()
            if name == "hang" and not value:
                fields["hang"] = True
            elif name == "status":
                status = _count(name, value)
                if not 400 <= status <= 599:
                    msg = f"mock fault 'status' must be an error status 400-599 (got {value!r})"
                    raise MockRequestError(msg)
                fields["status"] = status
            elif name in ("error-event-after", "drop-after", "unfinished-choice", "stop-after"):
                fields[name.replace("-", "_")] = _count(name, value)
            else:
                msg = f"unknown mock fault {part.strip()!r}"
                raise MockRequestError(msg)
        return cls(**fields)


NO_FAULTS = Faults()


# --------------------------------------------------------------------------- models


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment Hugging Face renders it in
    (the proxy's own: sandboxed, trim and lstrip blocks, loop controls, a
    ``tojson`` that keeps non-ASCII, ``raise_exception`` and ``strftime_now``)."""
    return template_environment().from_string(source)


def _context_length(directory: Path) -> int | None:
    path = directory / "config.json"
    if not path.exists():
        return None
    value = json.loads(path.read_text(encoding="utf-8"))
    length = value.get("max_position_embeddings") if isinstance(value, dict) else None
    return length if isinstance(length, int) and length > 0 else None


class ServedModel:
    """One served model: its tokenizer, compiled chat template and the
    pre-encoded output tokens. Built once at start-up; read-only afterwards
    except for the bounded prompt-count cache."""

    def __init__(
        self,
        name: str,
        tokenizer: Tokenizer,
        chat_template: str | None,
        special_tokens: Mapping[str, Any],
        context_length: int | None,
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.template = compile_chat_template(chat_template) if chat_template else None
        self.special_tokens = dict(special_tokens)
        self.context_length = context_length
        self.name_json = json.dumps(name)
        special_ids = set(tokenizer.get_added_tokens_decoder())
        ids = [
            i
            for i in tokenizer.encode(OUTPUT_SENTENCE, add_special_tokens=False).ids
            if i not in special_ids
        ]
        #: The output cycle: token ids, their texts, and each text as a JSON literal.
        self.output_ids: tuple[int, ...] = tuple(ids)
        self.output_texts: tuple[str, ...] = tuple(tokenizer.decode([i]) for i in ids)
        self.output_json: tuple[bytes, ...] = tuple(
            json.dumps(t).encode() for t in self.output_texts
        )
        #: Rendered prompt text -> token count; insertion-ordered, oldest evicted
        #: first. Touched only from the event loop.
        self._counts: dict[str, int] = {}

    @classmethod
    def load(cls, name: str, directory: Path | str) -> ServedModel:
        """Load a model directory as the proxy does: chat template and special
        tokens through ``transformers.AutoTokenizer``, the encoder from
        tokenizer.json exactly as written (Dynamo encodes with that; the
        AutoTokenizer backend may swap in a model family's own pre-tokenizer,
        e.g. for ``model_type: qwen2``, and then count differently)."""
        from transformers import AutoTokenizer

        directory = Path(directory)
        if not (directory / "tokenizer.json").exists():
            msg = f"model {name!r}: no tokenizer.json in {str(directory)!r}"
            raise ValueError(msg)
        hf = AutoTokenizer.from_pretrained(str(directory))
        template = hf.chat_template if isinstance(hf.chat_template, str) else None
        specials = dict(hf.special_tokens_map)
        encoder = Tokenizer.from_file(str(directory / "tokenizer.json"))
        return cls(name, encoder, template, specials, _context_length(directory))

    def encode_count(self, text: str) -> int:
        """Token count of ``text`` without special tokens (thread-safe, uncached)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def cached_count(self, text: str) -> int | None:
        return self._counts.get(text)

    def remember_count(self, text: str, count: int) -> None:
        counts = self._counts
        if len(counts) >= PROMPT_CACHE_SIZE:
            del counts[next(iter(counts))]
        counts[text] = count

    def chat_prompt_text(self, body: Mapping[str, Any]) -> str:
        """The prompt text of a chat request, rendered as the engine would see it."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            msg = "'messages' must be a non-empty list"
            raise MockRequestError(msg)
        if not all(isinstance(m, dict) for m in messages):
            msg = "each message must be an object"
            raise MockRequestError(msg)
        if self.template is None:
            msg = f"model {self.name!r} has no chat template"
            raise MockRequestError(msg)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            msg = "'chat_template_kwargs' must be an object"
            raise MockRequestError(msg)
        # As Hugging Face does: keys whose value is None are dropped from messages.
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            text = self.template.render(
                messages=messages,
                tools=body.get("tools"),
                documents=None,
                add_generation_prompt=True,
                **{**self.special_tokens, **kwargs},
            )
        except (jinja2.TemplateError, TypeError, ValueError) as exc:
            msg = f"chat template failed: {exc}"
            raise MockRequestError(msg) from exc
        return text

    def completion_prompts(self, prompt: object) -> list[str | int]:
        """The prompts of a completions request, one per prompt (a list of
        strings or of token-id lists is a batch): a text to encode, or the
        length of a token-id prompt."""
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(t, int) for t in prompt):
                return [len(prompt)]
            if all(isinstance(p, str) for p in prompt):
                return list(prompt)
            if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
                return [len(p) for p in prompt]
        msg = "'prompt' must be a string, a list of token ids, or a list of either"
        raise MockRequestError(msg)

    def output_text(self, count: int, diverge_at: int | None = None) -> str:
        if diverge_at is not None and diverge_at < count:
            cycle = self.output_texts
            return self.output_text(diverge_at) + "".join(
                cycle[(step + 1) % len(cycle)] for step in range(diverge_at, count)
            )
        cycle = self.output_texts
        full, rest = divmod(count, len(cycle))
        return "".join(cycle) * full + "".join(cycle[:rest])


# --------------------------------------------------------------------------- generation


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
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _int_field(body: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        msg = f"'{name}' must be an integer of at least 1 (got {value!r})"
        raise MockRequestError(msg)
    return value


# --------------------------------------------------------------------------- stats


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


STATS_KEY = web.AppKey("mock_stats", MockStats)
MODELS_KEY = web.AppKey("mock_models", dict)
CONFIG_KEY = web.AppKey("mock_config", MockConfig)


# --------------------------------------------------------------------------- handlers


class _Handlers:
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
        return web.json_response({"status": "ok"})

    async def list_models(self, _request: web.Request) -> web.Response:
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
        return web.json_response(attrs.asdict(self.stats))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
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
        """Validate the request and decide what to generate. Raises
        ``MockRequestError`` for anything a real frontend would reject."""
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = f"request body is not valid JSON: {exc}"
            raise MockRequestError(msg) from exc
        if not isinstance(body, dict):
            msg = "request body must be a JSON object"
            raise MockRequestError(msg)
        fault_text = request.headers.get(FAULT_HEADER) or body.get(FAULT_FIELD)
        faults = Faults.parse(fault_text if isinstance(fault_text, str) else None)
        name = body.get("model")
        if not isinstance(name, str):
            msg = "'model' must be a string"
            raise MockRequestError(msg)
        model = self.models.get(name)
        if model is None:
            msg = f"The model '{name}' does not exist."
            raise MockRequestError(msg, status=404, code="model_not_found")
        n = _int_field(body, "n", 1) or 1
        if n > MAX_CHOICES:
            msg = f"'n' must be at most {MAX_CHOICES} (got {n})"
            raise MockRequestError(msg)
        max_tokens = _int_field(body, "max_completion_tokens", None) or _int_field(
            body, "max_tokens", self.config.default_max_tokens
        )
        assert max_tokens is not None
        if chat:
            texts: list[str | int] = [model.chat_prompt_text(body)]
        else:
            texts = model.completion_prompts(body.get("prompt"))
        prompts = await self._count(model, texts)
        longest = max(prompts)
        if model.context_length is not None and longest + max_tokens > model.context_length:
            msg = (
                f"This model's maximum context length is {model.context_length} tokens. "
                f"However, you requested {longest + max_tokens} tokens "
                f"({longest} in the messages, {max_tokens} in the completion)."
            )
            raise MockRequestError(msg)
        stream = body.get("stream") is True
        options = body.get("stream_options")
        include_usage = (
            stream and isinstance(options, dict) and options.get("include_usage") is True
        )
        stop_after = faults.stop_after
        early_stop = stop_after is not None and stop_after < max_tokens
        prefix = "chatcmpl" if chat else "cmpl"
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        config = self.config
        diverge_id = request.headers.get(REQUEST_ID_HEADER) or response_id
        diverge = config.diverge_fraction > 0 and diverges(diverge_id, config.diverge_fraction)
        return Generation(
            chat=chat,
            stream=stream,
            model=model,
            response_id=response_id,
            created=int(time.time()),
            choices=n * len(prompts),
            tokens_per_choice=stop_after if early_stop and stop_after is not None else max_tokens,
            finish_reason="stop" if early_stop else "length",
            prompt_tokens=sum(prompts),
            include_usage=include_usage,
            faults=faults,
            diverge_at=config.diverge_at if diverge else None,
        )

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """Runs once per generation request. Every request started is counted
        exactly once more: completed, cancelled (the client went away),
        failed (a fault ended it) or rejected (invalid)."""
        stats = self.stats
        stats.requests_started += 1
        stats.in_flight += 1
        try:
            try:
                gen = await self._plan(request, await request.read(), chat)
            except MockRequestError as exc:
                stats.requests_rejected += 1
                kind = "invalid_request_error"
                return self._error(request, exc.status, str(exc), kind, exc.code or exc.status)
            if gen.faults.status is not None:
                stats.requests_failed += 1
                status = gen.faults.status
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

    def _stop_step(self, gen: Generation) -> int | None:
        """The step at which a fault ends the generation (None: it runs to the end)."""
        faults = gen.faults
        steps = [s for s in (faults.error_event_after, faults.drop_after) if s is not None]
        return min(min(steps), gen.tokens_per_choice) if steps else None

    async def _stream(self, request: web.Request, gen: Generation) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **self._headers(request),
            }
        )
        await resp.prepare(request)
        if gen.faults.hang:
            await self._hang(request)
            return resp
        encoder = ChunkEncoder(gen)
        stats = self.stats
        length = gen.tokens_per_choice
        stop_step = self._stop_step(gen)
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

    async def _unary(self, request: web.Request, gen: Generation) -> web.StreamResponse:
        if gen.faults.hang:
            await self._hang(request)
            return web.Response(status=499)
        stats = self.stats
        stop_step = self._stop_step(gen)
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


# --------------------------------------------------------------------------- app


def load_models(config: MockConfig) -> dict[str, ServedModel]:
    """Load every model the config names (slow: do it once)."""
    return {name: ServedModel.load(name, path) for name, path in config.models.items()}


def make_app(
    config: MockConfig, models: Mapping[str, ServedModel] | None = None
) -> web.Application:
    """The mock frontend's application. ``models`` lets callers share loaded
    models between apps (tests); by default they are loaded from ``config``."""
    loaded = dict(models) if models is not None else load_models(config)
    missing = sorted(set(config.models) - set(loaded))
    if missing:
        msg = f"'models' has no loaded model for {missing}"
        raise ValueError(msg)
    stats = MockStats()
    pool = (
        ThreadPoolExecutor(config.tokenizer_threads, thread_name_prefix="mock-tokenizer")
        if config.tokenizer_threads
        else None
    )
    handlers = _Handlers(config, loaded, stats, pool)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATS_KEY] = stats
    app[MODELS_KEY] = loaded
    app[CONFIG_KEY] = config

    async def shutdown_pool(_app: web.Application) -> AsyncIterator[None]:
        yield
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    app.cleanup_ctx.append(shutdown_pool)
    app.router.add_post("/v1/chat/completions", handlers.chat)
    app.router.add_post("/v1/completions", handlers.completions)
    # Imported here: frontend_responses builds on this module.
    from shadow_proxy.devtools.frontend_responses import ResponsesHandler

    app.router.add_post("/v1/responses", ResponsesHandler(handlers).handle)
    app.router.add_get("/v1/models", handlers.list_models)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/mock/stats", handlers.get_stats)
    return app


@contextlib.asynccontextmanager
async def serve_mock_frontend(
    config: MockConfig,
    models: Mapping[str, ServedModel] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> AsyncIterator[tuple[str, web.Application]]:
    """Run the mock on ``host:port`` (0: any free port) with the production
    settings (handler cancellation on, no access log); yields the base URL
    (``http://host:port``, without ``/v1``) and the app."""
    app = make_app(config, models)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}", app
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------- CLI


def _model_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep:
        return Path(text).name, Path(text)
    if not name or not path:
        msg = f"expected NAME=TOKENIZER_DIR (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return name, Path(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shadow-proxy mock-frontend",
        description="A mock OpenAI-compatible frontend with exact prompt token counts.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--model",
        action="append",
        type=_model_arg,
        metavar="NAME=TOKENIZER_DIR",
        help=f"a served model and its tokenizer directory; repeatable (default {DEFAULT_MODEL})",
    )
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="time to first token")
    parser.add_argument("--itl-ms", type=float, default=0.0, help="time per output token")
    parser.add_argument(
        "--default-max-tokens", type=int, default=16, help="tokens per choice without max_tokens"
    )
    parser.add_argument(
        "--diverge-fraction",
        type=float,
        default=0.0,
        help="fraction of requests (by request id) whose output differs from --diverge-at on",
    )
    parser.add_argument(
        "--diverge-at", type=int, default=0, help="token position where outputs diverge"
    )
    parser.add_argument(
        "--tokenizer-threads",
        type=int,
        default=1,
        help="threads encoding prompts off the event loop (0: inline)",
    )
    return parser


def run_mock_frontend(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: serve until interrupted. Exit status 2 on bad arguments."""
    args = build_parser().parse_args(argv)
    pairs = args.model or [_model_arg(DEFAULT_MODEL)]
    try:
        config = MockConfig(
            models=dict(pairs),
            ttft_ms=args.ttft_ms,
            itl_ms=args.itl_ms,
            default_max_tokens=args.default_max_tokens,
            tokenizer_threads=args.tokenizer_threads,
            diverge_fraction=args.diverge_fraction,
            diverge_at=args.diverge_at,
        )
        app = make_app(config)
    except (ValueError, OSError) as exc:
        print(f"mock-frontend: {exc}", file=sys.stderr)
        return 2
    import uvloop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log.info("mock frontend serving %s on %s:%d", ", ".join(config.models), args.host, args.port)
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        loop=uvloop.new_event_loop(),
        handler_cancellation=True,
        access_log=None,
        print=None,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_mock_frontend())
