"""The candidate client: one streaming completions request -> an ``Observation``.

``CandidateClient.send`` runs once per replayed request per deployment
(candidate, and baseline when given; ``target`` names which, and picks the
request id it sends: ``CandidateRequest.headers_for``). It never raises for
what the deployment does: an error status, an error event, a broken or refused
connection or a timeout ends as an ``Observation`` with ``outcome: error``,
``error_kind`` (``http``, ``connection``, ``timeout``, ``stream``),
``http_status`` (when there was one) and ``error`` (a message, clipped), so the
replay goes on. ``CandidateClient.check`` runs once before a replay: the
deployment must answer ``GET /v1/models`` (``TargetUnavailable`` says why not).

One ``aiohttp.ClientSession`` per deployment, with a bounded connector
(``limit`` = the replay's concurrency) and explicit timeouts: connect
(``connect_timeout_s``), and between two reads (``read_timeout_s``); no total
timeout, as a long generation is not a failure. ``auto_decompress`` stays on
(the body is parsed, not forwarded).

What is measured, with ``time.monotonic_ns`` from just before the request is
sent: TTFT (first chunk carrying text or token ids), the last such chunk, and
the end (``[DONE]`` or the end of the body). Per choice: finish reason, text
(at most ``max_text_bytes`` per choice; past it ``truncated``), token ids when
the deployment returns them on the choice (vLLM's ``return_token_ids``; at most
``MAX_TOKEN_IDS`` per choice), and
chunk counts; per response: the last ``usage`` and the ``id``. Without
returned ids and with a ``tokenizer``, each choice's text is encoded (without
special tokens, as the proxy retokenizes a primary's output) in a one-thread
pool off the event loop, so ids compare with a record's retokenized ids.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import attrs
from yarl import URL

from shadow_proxy.replay.compare import Observation, mean_itl_ms
from shadow_proxy.replay.request import COMPLETIONS_PATH, MODELS_PATH, CandidateRequest
from shadow_proxy.sockets import ack_now

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 300.0
DEFAULT_MAX_TEXT_BYTES = 1 << 20
#: Returned token ids kept per choice; past it the choice is ``truncated``.
MAX_TOKEN_IDS = 1 << 18
MAX_ERROR_CHARS = 300
MAX_ERROR_BODY_BYTES = 64 * 1024
#: aiohttp's line limit; an SSE line longer than this is an error.
MAX_LINE_BYTES = 1 << 22


#: ``check``: how long ``/v1/models`` may take to answer, beyond the connect timeout.
CHECK_TIMEOUT_S = 10.0


class TargetUnavailable(ValueError):
    """A deployment does not answer as an OpenAI-compatible server; the message says why."""


def check_url(url: str, option: str) -> str:
    """``url`` if it is an http(s) base URL, else ``ValueError`` naming ``option``."""
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        msg = f"'{option}' must be an http:// or https:// URL (got {url!r})"
        raise ValueError(msg)
    return url


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


@attrs.define
class _Choice:
    text: list[str] = attrs.field(factory=list)
    text_bytes: int = 0
    truncated: bool = False
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    chunks: int = 0


@attrs.define
class _Stream:
    """What one response stream said so far."""

    choices: dict[int, _Choice] = attrs.field(factory=dict)
    first_ns: int | None = None
    last_ns: int | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    error_kind: str | None = None
    done: bool = False
    upstream_id: str | None = None

    def fail(self, kind: str, message: str) -> None:
        self.error, self.error_kind = _clip(message), kind

    def on_event(self, data: bytes, now_ns: int, max_text_bytes: int) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            self.fail("stream", "stream event is not JSON")
            return
        if not isinstance(event, dict):
            return
        if self.upstream_id is None and isinstance(event.get("id"), str):
            self.upstream_id = event["id"][:256]
        if isinstance(event.get("error"), dict | str):
            err = event["error"]
            message = err.get("message") if isinstance(err, dict) else err
            self.fail("stream", str(message or "error event"))
            return
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        content = False
        for raw in event.get("choices") or ():
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", 0)
            choice = self.choices.get(index)
            if choice is None:
                choice = self.choices[index] = _Choice()
            text = raw.get("text")
            ids = raw.get("token_ids")
            if isinstance(text, str) and text:
                content = True
                choice.chunks += 1
                size = len(text.encode())
                if choice.text_bytes + size <= max_text_bytes:
                    choice.text.append(text)
                    choice.text_bytes += size
                else:
                    choice.truncated = True
            if isinstance(ids, list) and ids:
                content = True
                if choice.token_ids is None:
                    choice.token_ids = []
                room = MAX_TOKEN_IDS - len(choice.token_ids)
                choice.token_ids.extend(ids[:room])
                choice.truncated = choice.truncated or len(ids) > room
            if raw.get("finish_reason") is not None:
                choice.finish_reason = str(raw["finish_reason"])
        if content:
            if self.first_ns is None:
                self.first_ns = now_ns
            self.last_ns = now_ns


class CandidateClient:
    """Streams completions from one deployment at ``base_url`` (without ``/v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        concurrency: int,
        target: str = "candidate",
        tokenizer: Any | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    ) -> None:
        if concurrency < 1:
            msg = f"'concurrency' must be at least 1 (got {concurrency})"
            raise ValueError(msg)
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + COMPLETIONS_PATH
        self.target = target
        self._connect_timeout_s = connect_timeout_s
        self.max_text_bytes = max_text_bytes
        self._encode: Callable[[str], list[int]] | None = None
        self._pool: ThreadPoolExecutor | None = None
        if tokenizer is not None:
            self._encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="replay-retokenize")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=connect_timeout_s, sock_read=read_timeout_s
            ),
            read_bufsize=1 << 18,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
        )

    async def close(self) -> None:
        await self._session.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> CandidateClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def check(self, model: str | None = None) -> list[str]:
        """The model names ``GET /v1/models`` lists; ``TargetUnavailable`` when it
        does not answer 200 with a model list, or does not list ``model``."""
        where = f"{self.target} {self.base_url}"
        timeout = aiohttp.ClientTimeout(total=self._connect_timeout_s + CHECK_TIMEOUT_S)
        try:
            async with self._session.get(self.base_url + MODELS_PATH, timeout=timeout) as resp:
                body = await resp.content.read(MAX_ERROR_BODY_BYTES)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            msg = f"{where} does not answer GET {MODELS_PATH}: {_describe(exc)}"
            raise TargetUnavailable(msg) from exc
        if status != 200:
            detail = _error_message(body, status)
            msg = f"{where} answers GET {MODELS_PATH} with HTTP {status}: {detail}"
            raise TargetUnavailable(msg)
        try:
            listed = json.loads(body)["data"]
            names = [str(m["id"]) for m in listed]
        except (ValueError, KeyError, TypeError) as exc:
            msg = f"{where}: GET {MODELS_PATH} is not an OpenAI model list"
            raise TargetUnavailable(msg) from exc
        if model is not None and model not in names:
            msg = f"{where} does not serve model {model!r} (it lists {', '.join(names) or 'none'})"
            raise TargetUnavailable(msg)
        return names

    async def send(self, request: CandidateRequest) -> Observation:
        """Send one request and watch its stream to the end; never raises for
        what the deployment does (cancellation still propagates)."""
        stream = _Stream()
        started = time.monotonic_ns()
        status: int | None = None
        try:
            async with self._session.post(
                self.url, json=request.body, headers=request.headers_for(self.target)
            ) as resp:
                # As the proxy measured the primary: no delayed-ACK stall in the TTFT.
                ack_now(resp.connection)
                status = resp.status
                if status >= 400:
                    body = await resp.content.read(MAX_ERROR_BODY_BYTES)
                    return _failed(status, _error_message(body, status), started)
                await self._read_stream(resp, stream)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            stream.fail(_kind(exc, started=status is not None), _describe(exc))
        end = time.monotonic_ns()
        return await self._observe(request, stream, status, started, end)

    async def _read_stream(self, resp: aiohttp.ClientResponse, stream: _Stream) -> None:
        data: list[bytes] = []
        limit = self.max_text_bytes
        async for line in resp.content:
            line = line.rstrip(b"\r\n")
            if not line:
                if data:
                    stream.on_event(b"\n".join(data), time.monotonic_ns(), limit)
                    data.clear()
                if stream.done or stream.error:
                    return
                continue
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
        if data:
            stream.on_event(b"\n".join(data), time.monotonic_ns(), limit)

    async def _observe(
        self,
        request: CandidateRequest,
        stream: _Stream,
        status: int | None,
        started: int,
        end: int,
    ) -> Observation:
        indices = sorted(stream.choices)
        choices = [stream.choices[i] for i in indices]
        texts = tuple("".join(c.text) for c in choices)
        ids: tuple[tuple[int, ...], ...] | None = None
        if choices and all(c.token_ids is not None for c in choices):
            ids = tuple(tuple(c.token_ids or ()) for c in choices)
        elif choices and self._encode is not None and self._pool is not None:
            loop = asyncio.get_running_loop()
            encoded = await loop.run_in_executor(self._pool, _encode_all, self._encode, texts)
            ids = tuple(tuple(e) for e in encoded)
        own = [len(ids[k]) if ids is not None else c.chunks for k, c in enumerate(choices)]
        returned = bool(choices) and all(c.token_ids is not None for c in choices)
        usage = stream.usage or {}
        completion = usage.get("completion_tokens")
        if isinstance(completion, int) and len(own) == 1:
            own = [completion]
        output = completion if isinstance(completion, int) else (sum(own) if own else None)
        exact = completion if isinstance(completion, int) else (sum(own) if returned else None)
        wanted = int(request.body.get("n") or 1)
        finished = len(choices) >= wanted and all(c.finish_reason for c in choices)
        outcome = "complete" if finished else "incomplete"
        if stream.error is not None:
            outcome = "error"
        prompt = usage.get("prompt_tokens")
        return Observation(
            outcome=outcome,
            finish_reasons=tuple(c.finish_reason for c in choices),
            choice_tokens=tuple(own),
            output_tokens=output,
            exact_tokens=exact,
            token_ids=ids,
            texts=texts,
            truncated=any(c.truncated for c in choices),
            ttft_ms=None if stream.first_ns is None else (stream.first_ns - started) / 1e6,
            itl_ms=mean_itl_ms(stream.first_ns, stream.last_ns, max(own, default=0)),
            e2e_ms=(end - started) / 1e6,
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            cached_tokens=_cached_tokens(usage),
            http_status=status,
            error=stream.error,
            upstream_id=stream.upstream_id,
            error_kind=stream.error_kind,
        )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _kind(exc: BaseException, *, started: bool) -> str:
    """What failed: ``timeout`` (connect or read), ``connection`` (no answer
    began), ``stream`` (the answer began, then broke)."""
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return "timeout"
    return "stream" if started else "connection"


def _encode_all(encode: Callable[[str], list[int]], texts: tuple[str, ...]) -> list[list[int]]:
    return [encode(t) if t else [] for t in texts]


def _failed(status: int, message: str, started: int) -> Observation:
    return Observation(
        outcome="error",
        e2e_ms=(time.monotonic_ns() - started) / 1e6,
        http_status=status,
        error=message,
        error_kind="http",
    )


def _error_message(body: bytes, status: int) -> str:
    try:
        value = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return _clip(text or f"HTTP {status}")
    if isinstance(value, dict):
        err = value.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return _clip(err["message"])
        if isinstance(err, str):
            return _clip(err)
        if isinstance(value.get("detail"), str):
            return _clip(value["detail"])
        if isinstance(value.get("message"), str):
            return _clip(value["message"])
    return _clip(body.decode("utf-8", "replace"))


def _cached_tokens(usage: dict[str, Any]) -> int | None:
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else None
