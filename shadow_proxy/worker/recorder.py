"""Per-request response accumulation, the outcome rules, and the joined record's
``response`` map (SPEC section 3, "Response").

Runs in the tap worker. The serving loop forwards the frontend's bytes untouched
and hands the worker a copy: ``head`` once the response headers arrived, ``feed``
for each body chunk (exact read boundaries, still content-encoded, with its
monotonic offset from arrival), ``finish`` with the ``EndKind`` when the exchange
is over, however it ended. ``finish`` returns an ``ObservedResponse``;
``ObservedResponse.finalize(encode)`` tokenizes what needs tokenizing, once per
request, and ``FinalResponse.to_record(...)`` builds each tap's map cheaply.

Three stages, because taps differ only in what they keep (token ids, text,
``max_tokens``, chunk timing) while the expensive parts, decoding and parsing
the stream and retokenizing each choice, must run once per request.

What is read from the body, per choice index: ``finish_reason``; output text
(chat: ``delta``/``message`` ``content``, ``reasoning_content`` and
``reasoning``, tool-call ``function.name``/``arguments``; completions: ``text``);
upstream output token ids where the frontend returns them on the choice
(``choice.token_ids``: vLLM's ``return_token_ids``); the number of
content-carrying chunks. Dynamo's response ``nvext.token_ids`` is *not* used: it
holds the tokenized prompt (GAIE query-only flow), not output tokens. Per
response: ``id`` (``upstream_id``), the last ``usage`` seen (usage-only chunks
included), error events and bodies, ``[DONE]``.

Memory bound per in-flight recorder (defaults in parentheses; every cap is a
constructor argument):

- SSE parser: one event, at most ``max_event_bytes`` (8 MiB), plus the decoded
  piece being parsed (at most ``_DECODE_STEP`` = 256 KiB per decompression step,
  or the raw chunk when not encoded);
- or, for a unary (JSON) body, ``max_unary_bytes`` (16 MiB) of body, never both;
- output text: ``max_text_bytes_per_choice`` (2 MiB) per choice and at most
  ``max_text_bytes_total`` (8 MiB) over all choices, held as UTF-8 in a
  ``bytearray`` (up to ~1/8 over-allocation);
- upstream token ids: ``max_token_ids_per_choice`` (1 Mi ids; the worker passes
  the largest ``max_tokens`` of the taps when all of them set one) and at most
  ``max_token_ids_total`` (2 Mi ids) over all choices, 4 bytes each;
- chunk offsets (only with ``chunk_timing``): ``max_chunk_offsets`` (256 Ki), 8
  bytes each;
- at most ``max_choices`` (128) distinct choice indices, ~0.5 KiB each; the
  ``usage`` map and ``id`` are bounded by the event cap (``id`` to 256 chars,
  error messages to 512).

Worst case, all caps reached: about 8 + 0.25 + 9 + 9 + 2 ≈ 28 MiB for a stream
(16 MiB of body instead of the SSE buffer for a unary response; its text and ids
come from one parse at ``finish``), plus the transient Python objects of the one
JSON event or body being decoded. Typical use is far below: measured with
tracemalloc (memory still held by the recorder after feeding the whole body in
4 KiB reads, one token per chunk, ~240-byte chunks), a streamed 20,000-token
chat response holds 101 KiB (text only), 183 KiB (with upstream ids; 102 KiB when
the taps' ``max_tokens`` is 256), +164 KiB with ``chunk_timing``; with n=4
(4 x 20,000 tokens): 387 KiB, 715 KiB with ids, 391 KiB with ids kept to 256,
+625 KiB with ``chunk_timing``. Peaks during ``feed`` were at most 16 KiB above.
"""

from __future__ import annotations

import json
import logging
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.sse import DEFAULT_MAX_EVENT_BYTES, SSEEvent, SSEParser

log = logging.getLogger(__name__)

KIB = 1024
MIB = 1024 * KIB

DEFAULT_MAX_TEXT_BYTES_PER_CHOICE = 2 * MIB
DEFAULT_MAX_TEXT_BYTES_TOTAL = 8 * MIB
DEFAULT_MAX_TOKEN_IDS_PER_CHOICE = 1 << 20
DEFAULT_MAX_TOKEN_IDS_TOTAL = 1 << 21
DEFAULT_MAX_UNARY_BYTES = 16 * MIB
DEFAULT_MAX_CHUNK_OFFSETS = 1 << 18
DEFAULT_MAX_CHOICES = 128
MAX_ERROR_CHARS = 512
MAX_ID_CHARS = 256

#: Largest piece of decompressed output handled at once (bounds a gzip bomb).
_DECODE_STEP = 256 * KIB
_ID_TYPE = "I" if array("I").itemsize >= 4 else "L"

OUTCOMES = ("complete", "incomplete", "cancelled", "error")

#: Default error messages for ends that are errors whatever the body said.
_END_ERRORS = {
    EndKind.UPSTREAM_BROKEN: "upstream connection broke",
    EndKind.TIMEOUT: "upstream read timed out",
    EndKind.UPSTREAM_FAILED: "upstream request failed",
    EndKind.SHUTDOWN: "proxy shut down",
}
#: Finish reasons that end a choice without finishing it (not errors).
_ABORTED = frozenset({"abort", "cancelled", "canceled"})


def _is_error_reason(reason: str) -> bool:
    return reason == "error" or reason.startswith("error:")


def _clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_message(obj: Any, *, detail: bool = False) -> str | None:
    """The error a JSON body or event carries, or None. ``detail`` also accepts
    FastAPI's ``{"detail": ...}`` (only meaningful on an error status)."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        message = err.get("message")
        if isinstance(message, str) and message:
            return _clip(message)
        return _clip(json.dumps(err, ensure_ascii=False))
    if isinstance(err, str) and err:
        return _clip(err)
    if obj.get("object") == "error":
        message = obj.get("message")
        return _clip(message if isinstance(message, str) else json.dumps(obj))
    if detail and "detail" in obj:
        value = obj["detail"]
        return _clip(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    return None


# --------------------------------------------------------------------------- values


@attrs.frozen(eq=True, hash=False)
class ObservedChoice:
    """One choice as the frontend sent it."""

    index: int
    finish_reason: str | None
    text: str
    text_truncated: bool
    content_chunks: int
    #: The output token ids the frontend returned (as kept: see ``token_ids_complete``),
    #: or None when it returned none for this choice.
    upstream_token_ids: Sequence[int] | None
    #: How many upstream ids arrived (also those over the keep cap).
    upstream_token_count: int = 0

    @property
    def token_ids_complete(self) -> bool:
        return self.upstream_token_ids is not None and (
            len(self.upstream_token_ids) == self.upstream_token_count
        )


@attrs.frozen(eq=True, hash=False)
class ObservedResponse:
    """What one response looked like, and how it ended. ``outcome`` follows SPEC:
    ``cancelled`` if the client went away first; ``error`` on an error status, an
    error event or body, a failed connection, a timeout, shutdown or a lost
    capture; ``complete`` if each of the ``n`` requested choices (indices
    0..n-1) finished and none failed; ``incomplete`` otherwise."""

    outcome: str
    http_status: int | None
    error: str | None
    upstream_id: str | None
    usage: dict[str, Any] | None
    choices: tuple[ObservedChoice, ...]
    first_token_offset_ns: int | None
    last_token_offset_ns: int | None
    end_offset_ns: int
    chunk_offsets_ns: Sequence[int]
    end: EndKind = EndKind.CLEAN
    n: int = 1
    #: SSE events seen, and those whose data was not usable JSON.
    events: int = 0
    malformed_events: int = 0
    #: Events dropped over the SSE event cap, or left unfinished at stream end.
    oversized_events: int = 0
    truncated_events: int = 0
    #: Choice entries ignored (index not a small non-negative int, or over the cap).
    ignored_choices: int = 0
    #: Body bytes that could not be decoded (unsupported or corrupt encoding).
    undecodable_bytes: int = 0
    #: Why the body could not be read in full, if so (encoding, size).
    body_problem: str | None = None
    done_seen: bool = False
    #: Chunk offsets dropped over ``max_chunk_offsets``.
    dropped_chunk_offsets: int = 0

    def finalize(
        self, encode: Callable[[str], list[int]], *, token_ids: bool = True
    ) -> FinalResponse:
        """Count (and, if ``token_ids``, list) each choice's output tokens; the one
        place that tokenizes. Call it once per request, then ``to_record`` per tap.

        Per choice, the ids are the frontend's where it returned them
        (``token_ids_source: upstream``), else ``encode(text)`` (``retokenized``).
        ``output_tokens``: with ``usage.completion_tokens`` in the response, the
        usage total is apportioned over the choices in proportion to each
        choice's own count (largest remainder, ties to the lower index), so with
        one choice it is exactly the usage figure and with several the sum
        equals it; without usage, each choice's own count. A choice whose text
        was truncated (and has no upstream ids) counts at least its content
        chunks. With ``token_ids=False`` and usage present nothing is encoded.
        A failing ``encode`` is caught: the counts fall back to content chunks,
        ``retokenize_error`` says why, and no token ids are given.
        """
        completion = (self.usage or {}).get("completion_tokens")
        has_usage = isinstance(completion, int) and not isinstance(completion, bool)
        has_usage = has_usage and completion >= 0
        ids: list[Sequence[int] | None] = []
        own: list[int] = []
        complete: list[bool] = []
        failure: str | None = None
        for choice in self.choices:
            if choice.upstream_token_ids is not None:
                ids.append(choice.upstream_token_ids)
                own.append(choice.upstream_token_count)
                complete.append(choice.token_ids_complete)
                continue
            need_ids = token_ids or not has_usage
            retokenized: Sequence[int] | None = None
            if need_ids and choice.text and failure is None:
                try:
                    retokenized = encode(choice.text)
                except Exception as exc:  # a tokenizer failure must not lose the record
                    failure = _clip(f"{type(exc).__name__}: {exc}")
                    log.warning(
                        "retokenizing output failed (%s); counting chunks", type(exc).__name__
                    )
            elif need_ids and not choice.text:
                retokenized = []
            count = len(retokenized) if retokenized is not None else choice.content_chunks
            if choice.text_truncated:
                count = max(count, choice.content_chunks)
            ids.append(retokenized if token_ids else None)
            own.append(count)
            complete.append(not choice.text_truncated)
        counts = _apportion(completion, own) if has_usage and own else own
        if failure is not None:
            source = None
            ids = [
                i if c.upstream_token_ids is not None else None
                for i, c in zip(ids, self.choices, strict=True)
            ]
        else:
            upstream = any(c.upstream_token_ids is not None for c in self.choices)
            retokenized_any = any(c.upstream_token_ids is None and c.text for c in self.choices)
            source = "upstream" if upstream and not retokenized_any else "retokenized"
        return FinalResponse(
            observed=self,
            output_tokens=tuple(counts),
            token_ids=tuple(ids),
            token_ids_complete=tuple(complete),
            token_ids_source=source,
            has_token_ids=token_ids,
            retokenize_error=failure,
        )

    def to_record(
        self,
        encode: Callable[[str], list[int]],
        *,
        tokens: bool,
        text: bool,
        max_tokens: int | None,
        chunk_timing: bool,
    ) -> dict[str, Any]:
        """One tap's ``response`` map. With several taps, call ``finalize`` once
        and ``FinalResponse.to_record`` per tap instead (one tokenization)."""
        final = self.finalize(encode, token_ids=tokens)
        return final.to_record(
            tokens=tokens, text=text, max_tokens=max_tokens, chunk_timing=chunk_timing
        )


def _without_none(value: Any) -> Any:
    """``value`` with None entries left out of its maps, at any depth (records
    never carry nil; frontends often send ``"prompt_tokens_details": null``)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value if v is not None]
    return value


def _apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` in proportion to ``weights`` (equal shares if all are 0),
    by largest remainder; ties go to the lower index. The parts sum to ``total``."""
    if not any(weights):
        weights = [1] * len(weights)
    whole = sum(weights)
    parts = [total * w // whole for w in weights]
    remainders = [total * w % whole for w in weights]
    short = total - sum(parts)
    for i in sorted(range(len(weights)), key=lambda i: (-remainders[i], i))[:short]:
        parts[i] += 1
    return parts


@attrs.frozen(eq=True, hash=False)
class FinalResponse:
    """An ``ObservedResponse`` with its token counts and ids settled; building a
    tap's record from it copies and slices, nothing more."""

    observed: ObservedResponse
    output_tokens: tuple[int, ...]
    token_ids: tuple[Sequence[int] | None, ...]
    #: Per choice: the ids are the whole output (not cut by a keep cap or a
    #: truncated text).
    token_ids_complete: tuple[bool, ...]
    token_ids_source: str | None
    has_token_ids: bool
    retokenize_error: str | None = None

    def to_record(
        self, *, tokens: bool, text: bool, max_tokens: int | None, chunk_timing: bool
    ) -> dict[str, Any]:
        """SPEC's ``response`` map for one tap: string keys, optional fields left
        out when empty (never None). ``token_ids`` are cut to ``max_tokens`` (then
        ``truncated: True``, also set when the ids are not the whole output);
        ``text_truncated: True`` joins ``text`` when the kept text was capped."""
        if max_tokens is not None and max_tokens < 1:
            msg = f"'max_tokens' must be at least 1 or None (got {max_tokens})"
            raise ValueError(msg)
        if tokens and not self.has_token_ids:
            msg = "token ids were not computed: finalize(encode, token_ids=True) first"
            raise ValueError(msg)
        obs = self.observed
        choices = []
        for choice, count, ids, whole in zip(
            obs.choices, self.output_tokens, self.token_ids, self.token_ids_complete, strict=True
        ):
            entry: dict[str, Any] = {"index": choice.index}
            if choice.finish_reason is not None:
                entry["finish_reason"] = choice.finish_reason
            entry["output_tokens"] = count
            if tokens and ids:
                if max_tokens is not None and len(ids) > max_tokens:
                    entry["token_ids"] = list(ids[:max_tokens])
                    entry["truncated"] = True
                else:
                    entry["token_ids"] = list(ids)
                    if not whole:
                        entry["truncated"] = True
            if text and choice.text:
                entry["text"] = choice.text
                if choice.text_truncated:
                    entry["text_truncated"] = True
            choices.append(entry)
        record: dict[str, Any] = {
            "outcome": obs.outcome,
            "choices": choices,
            "output_tokens": sum(self.output_tokens),
        }
        if obs.first_token_offset_ns is not None:
            record["first_token_offset_ns"] = obs.first_token_offset_ns
        if obs.last_token_offset_ns is not None:
            record["last_token_offset_ns"] = obs.last_token_offset_ns
        record["end_offset_ns"] = obs.end_offset_ns
        if chunk_timing and obs.chunk_offsets_ns:
            record["chunk_offsets_ns"] = list(obs.chunk_offsets_ns)
        if obs.http_status is not None:
            record["http_status"] = obs.http_status
        if obs.error:
            record["error"] = obs.error
        if obs.usage:
            record["usage"] = obs.usage
        if obs.upstream_id:
            record["upstream_id"] = obs.upstream_id
        if self.token_ids_source is not None:
            record["token_ids_source"] = self.token_ids_source
        return record


# --------------------------------------------------------------------------- recorder


class _Choice:
    __slots__ = (
        "content_chunks",
        "finish_reason",
        "id_count",
        "ids",
        "index",
        "text",
        "text_truncated",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.finish_reason: str | None = None
        self.text = bytearray()
        self.text_truncated = False
        self.content_chunks = 0
        self.ids: array[int] | None = None
        self.id_count = 0


class _Decoder:
    """Incremental Content-Encoding decoder (gzip, deflate in zlib or raw form,
    identity). Output comes in pieces of at most ``_DECODE_STEP`` bytes."""

    __slots__ = ("_head", "_obj", "kind")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._obj: Any = None
        self._head = b""
        if kind == "gzip":
            self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def decode(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of ``data``, produced one at a time (never all at
        once: a small compressed chunk may expand enormously); raises
        ``zlib.error`` on a corrupt stream."""
        if self.kind == "identity":
            yield data
            return
        if self._obj is None:  # deflate: zlib-wrapped (RFC 9110) or raw, as sent
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return
            self._head = b""
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._obj = zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
        while data:
            out = self._obj.decompress(data, _DECODE_STEP)
            data = self._obj.unconsumed_tail
            if self._obj.eof:
                rest = self._obj.unused_data
                if rest and self.kind == "gzip":
                    self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)  # next gzip member
                    data = rest
                else:
                    data = b""
            if out:
                yield out


class ResponseRecorder:
    """Accumulates one response as the serving loop saw it.

    ``head``, then ``feed`` per body chunk, then ``finish`` exactly once. Nothing
    here raises on what the frontend sent: bad encodings, malformed JSON and
    oversized events are counted on the result. Memory is bounded by the caps
    (module docstring).
    """

    def __init__(
        self,
        route: Route,
        n: int,
        *,
        chunk_timing: bool,
        max_text_bytes_per_choice: int = DEFAULT_MAX_TEXT_BYTES_PER_CHOICE,
        max_text_bytes_total: int = DEFAULT_MAX_TEXT_BYTES_TOTAL,
        max_token_ids_per_choice: int | None = None,
        max_token_ids_total: int = DEFAULT_MAX_TOKEN_IDS_TOTAL,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_unary_bytes: int = DEFAULT_MAX_UNARY_BYTES,
        max_chunk_offsets: int = DEFAULT_MAX_CHUNK_OFFSETS,
        max_choices: int = DEFAULT_MAX_CHOICES,
    ) -> None:
        self.route = route
        self.n = max(1, n)
        self.chunk_timing = chunk_timing
        self._max_text = max_text_bytes_per_choice
        self._max_text_total = max_text_bytes_total
        self._max_ids = (
            DEFAULT_MAX_TOKEN_IDS_PER_CHOICE
            if max_token_ids_per_choice is None
            else max_token_ids_per_choice
        )
        self._max_ids_total = max_token_ids_total
        self._max_event_bytes = max_event_bytes
        self._max_unary = max_unary_bytes
        self._max_offsets = max_chunk_offsets
        self._max_choices = max_choices

        self._status: int | None = None
        self._decoder: _Decoder | None = None
        self._sse: SSEParser | None = None
        self._body: bytearray | None = None  # unary body
        self._sniff = False  # no head seen: decide SSE or JSON from the first bytes
        self._ignoring = False  # the unary body went over its cap: ignore the rest
        self._encoding = "identity"
        self._last_offset: int | None = None
        self._result: ObservedResponse | None = None

        self._choices: dict[int, _Choice] = {}
        self._text_total = 0
        self._ids_total = 0
        self._upstream_id: str | None = None
        self._usage: dict[str, Any] | None = None
        self._error: str | None = None
        self._first: int | None = None
        self._last: int | None = None
        self._offsets: array[int] = array("q")
        self._dropped_offsets = 0
        self._malformed = 0
        self._ignored_choices = 0
        self._undecodable = 0
        self._problem: str | None = None
        self._done = False

    # -- the three calls ------------------------------------------------------------

    def head(self, status: int, content_type: str, content_encoding: str, offset_ns: int) -> None:
        """The response headers arrived. Only the first call counts."""
        if self._status is not None or self._result is not None:
            return
        self._status = status
        media = content_type.split(";", 1)[0].strip().lower()
        if media == "text/event-stream":
            self._sse = SSEParser(self._max_event_bytes)
        else:
            self._body = bytearray()
        encodings = [e.strip().lower() for e in content_encoding.split(",")]
        encodings = [e for e in encodings if e and e != "identity"]
        if not encodings:
            self._decoder = _Decoder("identity")
        elif len(encodings) == 1 and encodings[0] in ("gzip", "x-gzip", "deflate"):
            self._encoding = encodings[0]
            self._decoder = _Decoder("deflate" if encodings[0] == "deflate" else "gzip")
        else:
            self._problem = f"content-encoding {content_encoding.strip()!r} not decodable"

    def feed(self, data: bytes, offset_ns: int) -> None:
        """A body chunk the client was sent, ``offset_ns`` after arrival."""
        if self._result is not None or self._ignoring or not data:
            return
        if self._status is None and self._decoder is None:
            self._decoder = _Decoder("identity")
            self._sniff = True
        self._last_offset = offset_ns
        if self._decoder is None:
            self._undecodable += len(data)
            return
        try:
            for piece in self._decoder.decode(data):
                self._consume(piece, offset_ns)
                if self._ignoring:
                    return
        except zlib.error as exc:
            self._decoder = None
            self._undecodable += len(data)
            self._problem = _clip(f"corrupt {self._encoding} body: {exc}")
            self._body = None

    def finish(self, end: EndKind, offset_ns: int, detail: str = "") -> ObservedResponse:
        """The exchange is over: settle the outcome. Idempotent (later calls return
        the first result)."""
        if self._result is not None:
            return self._result
        if self._sse is not None:
            self._sse.close()
        elif self._body is not None and self._problem is None:
            self._parse_unary(self._body, self._last_offset)
            self._body = None
        outcome, error = self._outcome(end, detail)
        sse = self._sse
        self._result = ObservedResponse(
            outcome=outcome,
            http_status=self._status,
            error=error,
            upstream_id=self._upstream_id,
            usage=_without_none(self._usage) if self._usage else None,
            choices=tuple(self._observed(c) for _, c in sorted(self._choices.items())),
            first_token_offset_ns=self._first,
            last_token_offset_ns=self._last,
            end_offset_ns=offset_ns,
            chunk_offsets_ns=self._offsets,
            end=end,
            n=self.n,
            events=sse.events if sse else 0,
            malformed_events=self._malformed,
            oversized_events=sse.oversized_events if sse else 0,
            truncated_events=sse.truncated_events if sse else 0,
            ignored_choices=self._ignored_choices,
            undecodable_bytes=self._undecodable,
            body_problem=self._problem,
            done_seen=self._done,
            dropped_chunk_offsets=self._dropped_offsets,
        )
        self._choices = {}
        self._sse = None
        return self._result

    # -- body ----------------------------------------------------------------------

    def _consume(self, piece: bytes, offset_ns: int) -> None:
        if self._sniff:
            self._sniff = False
            start = piece.lstrip(b"\xef\xbb\xbf \t\r\n")[:6]
            if start.startswith((b"data:", b"event:", b":", b"id:")):
                self._sse = SSEParser(self._max_event_bytes)
            else:
                self._body = bytearray()
        if self._sse is not None:
            for event in self._sse.feed(piece):
                self._on_event(event, offset_ns)
        elif self._body is not None:
            if len(self._body) + len(piece) > self._max_unary:
                self._problem = f"body over {self._max_unary} bytes"
                self._body = None
                self._ignoring = True
            else:
                self._body += piece

    def _on_event(self, event: SSEEvent, offset_ns: int) -> None:
        if event.event == "error":
            self._on_error_event(event)
            return
        if event.event != "message":
            return  # annotations and other named events carry no output
        data = event.data
        if data == "[DONE]":
            self._done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self._malformed += 1
            return
        if not isinstance(obj, dict):
            self._malformed += 1
            return
        self._on_object(obj, offset_ns, stream=True)

    def _on_error_event(self, event: SSEEvent) -> None:
        message = None
        if event.data:
            try:
                message = _error_message(json.loads(event.data), detail=True)
            except ValueError:
                message = _clip(event.data)
            if message is None:
                message = _clip(event.data)
        elif event.comments:
            message = _clip(" -- ".join(event.comments))
        self._set_error(message or "error event")

    def _set_error(self, message: str) -> None:
        if self._error is None:
            self._error = message

    def _parse_unary(self, body: bytearray, offset_ns: int | None) -> None:
        if not body or body.isspace():
            return
        try:
            obj = json.loads(body)
        except ValueError:
            self._malformed += 1
            if self._status is not None and self._status >= 400:
                text = body[: MAX_ERROR_CHARS * 4].decode("utf-8", "replace").strip()
                self._set_error(_clip(text))
            return
        if not isinstance(obj, dict):
            self._malformed += 1
            return
        status_error = self._status is not None and self._status >= 400
        message = _error_message(obj, detail=status_error)
        if message is not None:
            self._set_error(message)
        self._on_object(obj, offset_ns, stream=False)

    # -- one chunk or body -------------------------------------------------------------

    def _on_object(self, obj: dict[str, Any], offset_ns: int | None, *, stream: bool) -> None:
        if stream:
            message = _error_message(obj)
            if message is not None:
                self._set_error(message)
        if self._upstream_id is None:
            rid = obj.get("id")
            if isinstance(rid, str) and rid:
                self._upstream_id = rid[:MAX_ID_CHARS]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        carried = False
        route = self.route
        for raw in choices:
            if not isinstance(raw, dict):
                self._ignored_choices += 1
                continue
            choice = self._choice(raw.get("index", 0))
            if choice is None:
                continue
            content = False
            if route is not Route.COMPLETIONS:
                part = raw.get("delta") if stream else raw.get("message")
                if isinstance(part, dict):
                    content = self._chat_part(choice, part)
            if route is not Route.CHAT:
                piece = raw.get("text")
                if isinstance(piece, str) and piece:
                    self._add_text(choice, piece)
                    content = True
            ids = raw.get("token_ids")
            if isinstance(ids, list) and ids and self._add_ids(choice, ids):
                content = True
            if content:
                choice.content_chunks += 1
                carried = True
            reason = raw.get("finish_reason")
            if reason is not None:
                choice.finish_reason = str(reason)[:MAX_ID_CHARS]
        if carried and offset_ns is not None:
            if self._first is None:
                self._first = offset_ns
            self._last = offset_ns
            if self.chunk_timing:
                if len(self._offsets) < self._max_offsets:
                    self._offsets.append(offset_ns)
                else:
                    self._dropped_offsets += 1

    def _chat_part(self, choice: _Choice, part: dict[str, Any]) -> bool:
        content = False
        piece = part.get("content")
        if isinstance(piece, str) and piece:
            self._add_text(choice, piece)
            content = True
        elif isinstance(piece, list):  # content parts
            for item in piece:
                if isinstance(item, dict) and isinstance(item.get("text"), str) and item["text"]:
                    self._add_text(choice, item["text"])
                    content = True
        reasoning = part.get("reasoning_content")
        other = part.get("reasoning")
        refusal = part.get("refusal")
        for piece in (reasoning, other if other != reasoning else None, refusal):
            if isinstance(piece, str) and piece:
                self._add_text(choice, piece)
                content = True
        calls = part.get("tool_calls")
        functions = (
            [c.get("function") for c in calls if isinstance(c, dict)]
            if isinstance(calls, list)
            else []
        )
        legacy = part.get("function_call")
        if isinstance(legacy, dict):
            functions.append(legacy)
        for function in functions:
            if not isinstance(function, dict):
                continue
            for key in ("name", "arguments"):
                piece = function.get(key)
                if isinstance(piece, str) and piece:
                    self._add_text(choice, piece)
                    content = True
        return content

    def _choice(self, index: Any) -> _Choice | None:
        choice = self._choices.get(index) if type(index) is int else None
        if choice is not None:
            return choice
        if type(index) is not int or index < 0 or len(self._choices) >= self._max_choices:
            self._ignored_choices += 1
            return None
        choice = self._choices[index] = _Choice(index)
        return choice

    def _add_text(self, choice: _Choice, piece: str) -> None:
        if choice.text_truncated:
            return
        data = piece.encode("utf-8", "replace")
        room = min(self._max_text - len(choice.text), self._max_text_total - self._text_total)
        if len(data) > room:
            # Cut at a character boundary; nothing more is kept for this choice.
            data = data[: max(room, 0)].decode("utf-8", "ignore").encode("utf-8")
            choice.text_truncated = True
        choice.text += data
        self._text_total += len(data)

    def _add_ids(self, choice: _Choice, ids: list[Any]) -> bool:
        if choice.ids is None:
            choice.ids = array(_ID_TYPE)
        kept = choice.ids
        room = min(self._max_ids - len(kept), self._max_ids_total - self._ids_total)
        before = len(kept)
        try:
            kept.extend(ids[: max(room, 0)])
        except (TypeError, OverflowError):
            del kept[before:]
            self._malformed += 1
            return False
        self._ids_total += len(kept) - before
        choice.id_count += len(ids)
        return True

    # -- the end ----------------------------------------------------------------------

    def _observed(self, choice: _Choice) -> ObservedChoice:
        return ObservedChoice(
            index=choice.index,
            finish_reason=choice.finish_reason,
            text=choice.text.decode("utf-8", "replace"),
            text_truncated=choice.text_truncated,
            content_chunks=choice.content_chunks,
            upstream_token_ids=choice.ids,
            upstream_token_count=choice.id_count,
        )

    def _outcome(self, end: EndKind, detail: str) -> tuple[str, str | None]:
        """SPEC's outcome rules, in order of precedence."""
        error = self._error
        if end is EndKind.CLIENT_GONE:
            return "cancelled", error
        if end is EndKind.CAPTURE_LOST:
            return "error", error or ("capture lost: " + detail if detail else "capture lost")
        if self._status is not None and self._status >= 400:
            if error is None and end in _END_ERRORS and detail:
                error = _clip(detail)  # the proxy answered itself: say why
            return "error", error or f"HTTP {self._status}"
        if error is not None:
            return "error", error
        if end in _END_ERRORS:
            return "error", _clip(detail) if detail else _END_ERRORS[end]
        for choice in sorted(self._choices.values(), key=lambda c: c.index):
            if choice.finish_reason is not None and _is_error_reason(choice.finish_reason):
                return "error", f"choice {choice.index} finished with {choice.finish_reason!r}"
        finished = all(
            (c := self._choices.get(i)) is not None
            and c.finish_reason is not None
            and c.finish_reason not in _ABORTED
            for i in range(self.n)
        )
        if finished and self._problem is None and self._decoder is not None:
            return "complete", None
        return "incomplete", self._problem
