"""A small asyncio load generator for OpenAI-compatible frontends.

Used by the demo and the benchmarks. Prompts are built before the clock starts
(distinct per request, about ``prompt_tokens`` tokens of the model's tokenizer
when ``tokens_per_word`` is measured for it with ``tokens_per_word_of``; the
default 1.0 holds for the common BPE vocabularies), then ``concurrency``
workers send ``requests`` requests and record per request: status, time to
first token (for streams: the first chunk that carries content, so that the
Responses API's ``response.created`` event, sent before any token, does not
count; unary: the whole body), end-to-end time, the frontend's ``usage`` and
whether the client cancelled it on purpose.

Cancelling is deterministic: request ``i`` is cancelled when
``(i * 7919) % 1000 < cancel_fraction * 1000`` (spread over the run). A
streaming request is cancelled right after its first content event (the
client closes the connection); a unary one when it has not completed (headers
and body) within ``cancel_after_s``.

``api`` picks the route: ``chat``, ``completions`` or ``responses`` (the
Responses API: the prompt as ``input``, ``max_output_tokens``; its usage,
``input_tokens``/``output_tokens``, is reported under the chat names
``prompt_tokens``/``completion_tokens`` in each ``Result``).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Iterable
from typing import Any

import aiohttp
import attrs

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
}
#: What marks the first content event of a stream, per api.
CONTENT_MARKS = {
    "chat": (b'"content"',),
    "completions": (b'"text"',),
    "responses": (b"response.output_text.delta",),
}

#: Words that are one token each in common BPE vocabularies (with the space).
_WORDS = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city name"
).split()


@attrs.frozen
class LoadSpec:
    """What to send: where, how many, how fast, how long, and which to cancel."""

    url: str
    model: str
    requests: int = 200
    concurrency: int = 16
    prompt_tokens: int = 512
    output_tokens: int = 32
    stream: bool = True
    api: str = "chat"
    cancel_fraction: float = 0.0
    cancel_after_s: float = 0.05
    include_usage: bool = True
    seed: int = 0
    headers: dict[str, str] = attrs.field(factory=dict)
    timeout_s: float = 600.0
    #: Tokens per word of the prompt's word list with the model's tokenizer
    #: (``tokens_per_word_of``): ``prompt_tokens`` counts tokens, not words.
    tokens_per_word: float = 1.0
    #: Seconds over which the ``concurrency`` senders start, evenly spaced (0: all
    #: at once). All at once, their requests run in step for the first second or
    #: so: waves of ``concurrency`` arrivals that a p99 over a few thousand
    #: requests reads instead of the steady state.
    ramp_s: float = 0.0

    def cancels(self, index: int) -> bool:
        """Whether the client cancels request ``index`` (deterministic, spread over the run)."""
        return (index * 7919) % 1000 < self.cancel_fraction * 1000


@attrs.define
class Result:
    """What one request got: status, timings, usage, and whether the client cancelled it."""

    index: int
    request_id: str = ""
    status: int = 0
    cancelled: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    #: When it was sent, in seconds from the start of the load.
    sent_s: float = 0.0
    usage: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """It ended with status 200, no error and no cancel."""
        return self.status == 200 and self.error is None and not self.cancelled


@attrs.define
class Report:
    """Every request's result, in request order, and how long the load took."""

    spec: LoadSpec
    results: list[Result]
    duration_s: float
    #: ``time.monotonic()`` at the start of the load (``Result.sent_s`` counts from
    #: it): events of other processes on the same clock can be put on its timeline.
    origin_monotonic: float = 0.0

    def summary(self) -> dict[str, Any]:
        """Counts, tokens, rate and latency percentiles (over the ok requests)."""
        ok = [r for r in self.results if r.ok]
        ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
        e2e = sorted(r.e2e_s for r in ok)
        usage = [r.usage for r in ok if r.usage]
        return {
            "requests": len(self.results),
            "ok": len(ok),
            "cancelled": sum(r.cancelled for r in self.results),
            "errors": sum(1 for r in self.results if not r.ok and not r.cancelled),
            "prompt_tokens": sum(u.get("prompt_tokens", 0) for u in usage),
            "completion_tokens": sum(u.get("completion_tokens", 0) for u in usage),
            "duration_s": round(self.duration_s, 3),
            "requests_per_s": round(len(ok) / self.duration_s, 2) if self.duration_s else 0.0,
            "ttft_p50_ms": _ms(percentile(ttft, 50)),
            "ttft_p99_ms": _ms(percentile(ttft, 99)),
            "e2e_p50_ms": _ms(percentile(e2e, 50)),
            "e2e_p99_ms": _ms(percentile(e2e, 99)),
        }


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of sorted ``values``: the smallest value with at
    least ``p`` percent of the values at or below it."""
    if not values:
        return None
    rank = max(1, min(len(values), math.ceil(p * len(values) / 100 - 1e-9)))
    return values[rank - 1]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def make_prompt(rng: random.Random, tokens: int, tokens_per_word: float = 1.0) -> str:
    """About ``tokens`` tokens of words (8 fewer: the request's prefix and the
    chat template's own tokens)."""
    words = max(1, round((tokens - 8) / tokens_per_word))
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def tokens_per_word_of(tokenizer_json: str, sample_words: int = 2000) -> float:
    """Tokens per word of the prompt's word list with the tokenizer in
    ``tokenizer_json`` (a Hugging Face ``tokenizer.json``)."""
    from tokenizers import Tokenizer

    text = make_prompt(random.Random(0), sample_words + 8)
    ids = Tokenizer.from_file(tokenizer_json).encode(text, add_special_tokens=False).ids
    return len(ids) / sample_words


def make_body(spec: LoadSpec, index: int) -> bytes:
    """Request ``index``'s body: a distinct prompt, the same for the same seed."""
    rng = random.Random(spec.seed * 1_000_003 + index)
    prompt = f"Request {index}. " + make_prompt(rng, spec.prompt_tokens, spec.tokens_per_word)
    if spec.api == "responses":
        return responses_body(spec, prompt)
    body: dict[str, Any] = {
        "model": spec.model,
        "max_tokens": spec.output_tokens,
        "stream": spec.stream,
        "ignore_eos": True,
    }
    if spec.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if spec.stream and spec.include_usage:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def many_tools(model: str, tools: int, properties: int) -> bytes:
    """A hostile chat request (issue 18's probe): ``tools`` tools of ``properties``
    described properties each; 600 x 1,000 make 62 MB."""
    description = "a plain description of what this property holds, and its format"
    parameters = {
        "type": "object",
        "properties": {
            f"p{i}": {"type": "string", "description": description} for i in range(properties)
        },
    }
    return json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": f"tool_{t}",
                        "description": "a tool",
                        "parameters": parameters,
                    },
                }
                for t in range(tools)
            ],
        }
    ).encode()


def responses_body(spec: LoadSpec, prompt: str) -> bytes:
    """A Responses API request: the prompt as ``input``, the output cap as
    ``max_output_tokens`` (no ``ignore_eos``: not a Responses field)."""
    body: dict[str, Any] = {
        "model": spec.model,
        "input": prompt,
        "max_output_tokens": spec.output_tokens,
        "stream": spec.stream,
    }
    return json.dumps(body).encode()


def usage_of(obj: Any) -> dict | None:
    """The usage a chunk, body or Responses event carries, with the chat names
    (Responses: ``input_tokens`` -> ``prompt_tokens``, ``output_tokens`` ->
    ``completion_tokens``)."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    response = obj.get("response")
    if usage is None and isinstance(response, dict):
        usage = response.get("usage")
    if not isinstance(usage, dict) or not usage:
        return None
    if "input_tokens" in usage and "prompt_tokens" not in usage:
        usage = {
            **usage,
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage.get("output_tokens", 0),
        }
    return usage


def _usage_from_sse(data: bytes) -> dict | None:
    for line in reversed(data.split(b"\n")):
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                usage = usage_of(json.loads(line[5:]))
            except ValueError:
                continue
            if usage:
                return usage
    return None


async def _one(
    session: aiohttp.ClientSession, spec: LoadSpec, index: int, body: bytes, load_started: float
) -> Result:
    path = PATHS[spec.api]
    cancel = spec.cancels(index)
    started = time.perf_counter()
    result = Result(index, sent_s=started - load_started)
    headers = {"Content-Type": "application/json", **spec.headers}
    try:
        if cancel and not spec.stream:
            # A unary answer's headers may come only with the whole body: the
            # client gives up on the request as a whole, headers included.
            try:
                async with asyncio.timeout(spec.cancel_after_s):
                    await _exchange(session, spec, path, body, headers, result, started, False)
            except TimeoutError:
                result.cancelled = True
        else:
            await _exchange(session, spec, path, body, headers, result, started, cancel)
    except (aiohttp.ClientError, ValueError, TimeoutError) as e:
        result.error = type(e).__name__
    result.e2e_s = time.perf_counter() - started
    return result


async def _exchange(
    session: aiohttp.ClientSession,
    spec: LoadSpec,
    path: str,
    body: bytes,
    headers: dict[str, str],
    result: Result,
    started: float,
    cancel: bool,
) -> None:
    """One request and its answer into ``result``; with ``cancel`` (streams), the
    client hangs up after the first content event."""
    async with session.post(spec.url + path, data=body, headers=headers) as response:
        result.status = response.status
        result.request_id = response.headers.get("x-request-id", "")
        chunks = []
        if spec.stream:
            marks = CONTENT_MARKS[spec.api]
            async for chunk in response.content.iter_any():
                content = any(mark in chunk for mark in marks)
                if result.ttft_s is None and content:
                    result.ttft_s = time.perf_counter() - started
                chunks.append(chunk)
                if cancel and content:
                    result.cancelled = True
                    response.close()
                    break
        else:
            chunks.append(await response.read())
            result.ttft_s = time.perf_counter() - started
        data = b"".join(chunks)
        if not result.cancelled and response.status == 200:
            if spec.stream:
                result.usage = _usage_from_sse(data)
                if not data.rstrip().endswith(b"data: [DONE]"):
                    result.error = "stream ended without [DONE]"
            else:
                result.usage = usage_of(json.loads(data))


async def run_load(spec: LoadSpec) -> Report:
    """Send the load described by ``spec`` (runs once per load; the bodies are
    built before the clock starts). Guarantees: every request gets exactly one
    ``Result``, in request order (a failure is recorded, never raised); at most
    ``concurrency`` requests are in flight, on one session."""
    bodies = [make_body(spec, i) for i in range(spec.requests)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(spec.requests):
        queue.put_nowait(i)
    results: list[Result] = []
    connector = aiohttp.TCPConnector(limit=spec.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:

        async def work(k: int) -> None:
            if spec.ramp_s > 0:
                await asyncio.sleep(k * spec.ramp_s / spec.concurrency)
            while not queue.empty():
                index = queue.get_nowait()
                results.append(await _one(session, spec, index, bodies[index], started))

        started, origin = time.perf_counter(), time.monotonic()
        await asyncio.gather(*(work(k) for k in range(spec.concurrency)))
        duration = time.perf_counter() - started
    results.sort(key=lambda r: r.index)
    return Report(spec, results, duration, origin)


async def first_bytes_ms(
    url: str, bodies: Iterable[dict[str, Any]], *, fresh: bool, gap_s: float = 0.01
) -> list[float]:
    """Milliseconds from sending each body (a JSON POST to ``url``) to its
    response's first body bytes, one request at a time with ``gap_s`` between,
    on one kept-alive connection or, with ``fresh``, a new connection each. Each
    response is read to its end, so that a kept-alive connection is reused; one
    without body bytes gives no time."""
    times = []
    connector = aiohttp.TCPConnector(force_close=fresh)
    async with aiohttp.ClientSession(connector=connector) as session:
        for body in bodies:
            started = time.perf_counter()
            first = None
            async with session.post(url, json=body) as response:
                async for _chunk in response.content.iter_any():
                    first = first or time.perf_counter() - started
            if first is not None:
                times.append(first * 1000)
            await asyncio.sleep(gap_s)
    return times
