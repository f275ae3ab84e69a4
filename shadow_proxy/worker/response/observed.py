"""What one response looked like (``ObservedResponse``), settled once per request
(``finalize``: the one place that tokenizes output), and each tap's ``response``
map built from it cheaply (``FinalResponse.to_record``). Pure values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from shadow_proxy.exchange import EndKind
from shadow_proxy.worker.response.outcome import clip

log = logging.getLogger(__name__)


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
    #: When the proxy sent the request to the frontend, after arrival (None:
    #: it did not, or the proxy did not say).
    upstream_sent_offset_ns: int | None = None
    #: Whether the response was an event stream (None: no response head).
    streamed: bool | None = None

    def finalize(
        self, encode: Callable[[str], list[int]] | None, *, token_ids: bool = True
    ) -> FinalResponse:
        """Count (and, if ``token_ids``, list) each choice's output tokens; the one
        place that tokenizes. Call it once per request, then ``to_record`` per tap.

        Per choice, the ids are the frontend's where it returned them
        (``token_ids_source: upstream``), else ``encode(text)`` (``retokenized``).
        ``output_tokens``: with ``usage.completion_tokens`` (Responses:
        ``usage.output_tokens``) in the response, the
        usage total is apportioned over the choices in proportion to each
        choice's own count (largest remainder, ties to the lower index), so with
        one choice it is exactly the usage figure and with several the sum
        equals it; without usage, each choice's own count. A choice whose text
        was truncated (and has no upstream ids) counts at least its content
        chunks. With ``token_ids=False`` and usage present nothing is encoded.
        A failing ``encode`` is caught: the counts fall back to content chunks,
        ``retokenize_error`` says why, and no token ids are given. ``encode=None``
        (a response read no further past a work budget, whose text may be megabytes
        of a bomb): nothing is encoded, counts are content chunks, no token ids.
        """
        usage = self.usage or {}
        reported = usage.get("completion_tokens", usage.get("output_tokens"))
        completion: int | None = None
        if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
            completion = reported
        has_usage = completion is not None
        ids: list[Sequence[int] | None] = []
        own: list[int] = []
        complete: list[bool] = []
        #: How each choice's own count was found (see ``OUTPUT_SOURCES``).
        sources: list[str] = []
        failure: str | None = None
        for choice in self.choices:
            if choice.upstream_token_ids is not None:
                ids.append(choice.upstream_token_ids)
                own.append(choice.upstream_token_count)
                complete.append(choice.token_ids_complete)
                sources.append("upstream")
                continue
            need_ids = token_ids or not has_usage
            retokenized: Sequence[int] | None = None
            if need_ids and choice.text and encode is not None and failure is None:
                try:
                    retokenized = encode(choice.text)
                except Exception as exc:  # a tokenizer failure must not lose the record
                    failure = clip(f"{type(exc).__name__}: {exc}")
                    log.warning(
                        "retokenizing output failed (%s); counting chunks", type(exc).__name__
                    )
            elif need_ids and not choice.text:
                retokenized = []
            count = len(retokenized) if retokenized is not None else choice.content_chunks
            found = "retokenized" if retokenized is not None else "chunks"
            if choice.text_truncated and choice.content_chunks > count:
                count, found = choice.content_chunks, "chunks"
            sources.append(found)
            ids.append(retokenized if token_ids else None)
            own.append(count)
            complete.append(not choice.text_truncated)
        counts = _apportion(completion, own) if completion is not None and own else own
        source: str | None
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
            if encode is None and retokenized_any:
                source = "upstream" if upstream else None
        if has_usage:
            output_source: str | None = "usage"
        else:
            output_source = max(sources, key=OUTPUT_SOURCES.index, default=None)
        return FinalResponse(
            observed=self,
            output_tokens=tuple(counts),
            output_tokens_source=output_source,
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


def without_none(value: Any) -> Any:
    """``value`` with None entries left out of its maps, at any depth (records
    never carry nil; frontends often send ``"prompt_tokens_details": null``)."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value if v is not None]
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


#: ``output_tokens_source``, exact first: ``usage`` (the frontend's
#: ``usage.completion_tokens``: exact in sum; split over several choices in
#: proportion), ``upstream`` (the token ids the frontend returned: exact),
#: ``retokenized`` (the output text encoded again: an estimate, a tokenizer
#: may split differently than the engine generated), ``chunks`` (content
#: chunks counted, when the text was cut or could not be encoded: an estimate).
OUTPUT_SOURCES = ("usage", "upstream", "retokenized", "chunks")


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
    output_tokens_source: str | None = None

    def to_record(
        self, *, tokens: bool, text: bool, max_tokens: int | None, chunk_timing: bool
    ) -> dict[str, Any]:
        """SPEC's ``response`` map for one tap: string keys, optional fields left
        out when empty (never None). ``token_ids`` are cut to ``max_tokens`` (then
        ``truncated: True``, also set when the ids are not the whole output, and
        whenever a choice has fewer ids than its ``output_tokens``);
        ``output_tokens_source`` says how exact the counts are (``OUTPUT_SOURCES``);
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
            if tokens and len(entry.get("token_ids", ())) < count:
                entry["truncated"] = True  # never fewer ids than the count, unsaid
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
        if obs.upstream_sent_offset_ns is not None:
            record["upstream_sent_offset_ns"] = obs.upstream_sent_offset_ns
        if obs.streamed is not None:
            record["streamed"] = obs.streamed
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
        if self.output_tokens_source is not None:
            record["output_tokens_source"] = self.output_tokens_source
        return record
