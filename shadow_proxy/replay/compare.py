"""One request, two answers: what differs (SPEC section 11, "Compared per request").

Pure: no socket, no clock. ``primary_observation`` reads what the record says
the primary answered; the candidate client builds the same ``Observation`` from
what it measured; ``compare`` runs once per pair (candidate against primary,
and baseline against primary) and returns a ``Difference``.

Definitions, the same on both sides so that a ratio compares like with like:

- the start: the primary's when the proxy sent the request to the frontend
  (the record's ``upstream_sent_offset_ns``; a record written before that
  field existed is timed from the request's arrival at the proxy, and
  ``timed_from`` says so), the candidate's just before the replayer sends it;
- TTFT: from the start to the first content-carrying chunk (the primary's
  ``first_token_offset_ns``). When one read carried every token, that read's
  time is still the TTFT. A primary that did not stream (``streamed: false``:
  a JSON body) has no TTFT: its first token came with the whole answer;
- mean inter-token latency: (last token - first token) / (tokens - 1), tokens
  being the largest per-choice output token count; undefined below 2 tokens,
  and for a primary whose tokens all came in one read (first = last) or that
  did not stream;
- end-to-end: from the start to the end of the response;
- a failed answer (outcome ``error``, or a primary the client cancelled) has
  no latency: statistics use successful pairs only (``Observation.succeeded``);
- output tokens are compared only between exact counts: a deployment's
  ``usage.completion_tokens``, else the token ids it returned itself. A count
  from retokenized text (a record without usage whose ids were retokenized, a
  candidate's text encoded with ``--tokenizer``) is an estimate: two different
  texts of the same length in tokens may retokenize to different lengths, so
  such a pair's token counts are not compared (``output_tokens_delta: None``);
- output equality, per choice: token ids when both sides have them for every
  choice, else text when both have it, else not compared (``basis: none``);
  when either side failed (outcome ``error``) the outputs are not compared
  either (``basis: error``, counted apart from ``none``).
  The first divergent position is the first index (token or character) at
  which the choices differ, the shorter length when one is a prefix of the
  other; the earliest over the choices, with its choice index. When the
  primary's ids were cut to a tap's ``max_tokens`` (``truncated``) or the
  primary did not complete, only its length is compared (``prefix: true``):
  an equal prefix counts as equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

BASES = ("token_ids", "text", "none", "error")
#: What kind of failure an ``error`` outcome was (``Observation.error_kind``):
#: an HTTP error status, no connection, no answer in time, a stream that
#: failed after it started (an error event, broken framing).
ERROR_KINDS = ("http", "connection", "timeout", "stream")
#: Where a primary's latencies start (``Observation.timed_from``).
TIMED_FROM = ("upstream_send", "arrival")


@attrs.frozen
class Observation:
    """What one deployment answered to one request."""

    outcome: str
    #: Per choice, sorted by index.
    finish_reasons: tuple[str | None, ...] = ()
    choice_tokens: tuple[int, ...] = ()
    output_tokens: int | None = None
    #: The output token count the deployment itself gave (usage, else its own
    #: returned ids); None when only an estimate exists (retokenized, chunks).
    exact_tokens: int | None = None
    token_ids: tuple[tuple[int, ...], ...] | None = None
    texts: tuple[str, ...] | None = None
    #: The output ids are a prefix of what was generated (a tap's cap).
    truncated: bool = False
    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None
    #: ``usage.prompt_tokens`` as the deployment reported it.
    prompt_tokens: int | None = None
    #: ``usage.prompt_tokens_details.cached_tokens``, where the deployment reports it.
    cached_tokens: int | None = None
    http_status: int | None = None
    error: str | None = None
    #: The response ``id`` the deployment gave (joins its logs and traces).
    upstream_id: str | None = None
    #: One of ``ERROR_KINDS`` when ``outcome`` is ``error``.
    error_kind: str | None = None
    #: The primary's: where its latencies start (one of ``TIMED_FROM``).
    timed_from: str | None = None

    @property
    def succeeded(self) -> bool:
        """An answer whose latencies mean something: not an error, and not cut
        short by the client."""
        return self.outcome not in ("error", "cancelled")

    @property
    def error_key(self) -> str:
        """The failure's key in ``errors_by_status``: the HTTP status, else the kind."""
        if self.error_kind == "http" and self.http_status is not None:
            return str(self.http_status)
        return self.error_kind or "connection"

    def to_json(self) -> dict[str, Any]:
        """The fields written to pairs.jsonl (outputs left out: they are large)."""
        out: dict[str, Any] = {
            "outcome": self.outcome,
            "finish_reasons": list(self.finish_reasons),
            "output_tokens": self.output_tokens,
            "ttft_ms": _round(self.ttft_ms),
            "itl_ms": _round(self.itl_ms),
            "e2e_ms": _round(self.e2e_ms),
            "prompt_tokens": self.prompt_tokens,
        }
        if self.http_status is not None:
            out["http_status"] = self.http_status
        if self.error is not None:
            out["error"] = self.error
        if self.error_kind is not None:
            out["error_kind"] = self.error_kind
        if self.timed_from is not None:
            out["timed_from"] = self.timed_from
        if self.upstream_id is not None:
            out["upstream_id"] = self.upstream_id
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def mean_itl_ms(first_ns: int | None, last_ns: int | None, tokens: int) -> float | None:
    """(last - first) / (tokens - 1) in ms; None below two tokens or without offsets."""
    if first_ns is None or last_ns is None or tokens < 2:
        return None
    return (last_ns - first_ns) / (tokens - 1) / 1e6


def primary_observation(envelope: Mapping[str, Any]) -> Observation:
    """The primary's answer as the joined record holds it (``response`` required)."""
    response = envelope["response"]
    choices = sorted(
        (c for c in response.get("choices", ()) if isinstance(c, Mapping)),
        key=lambda c: c.get("index", 0),
    )
    counts = tuple(int(c.get("output_tokens", 0)) for c in choices)
    ids = [c.get("token_ids") for c in choices]
    id_lists = [i for i in ids if isinstance(i, list)]
    texts = [c.get("text") for c in choices]
    strings = [t for t in texts if isinstance(t, str)]
    sent = _offset(response.get("upstream_sent_offset_ns"))
    start = sent or 0
    first = _offset(response.get("first_token_offset_ns"))
    last = _offset(response.get("last_token_offset_ns"))
    end = _offset(response.get("end_offset_ns"))
    if response.get("streamed") is False:
        first = last = None  # a JSON body: the first token came with the whole answer
    itl_last = None if last == first else last  # one read carried every token: no ITL
    usage = response.get("usage") if isinstance(response.get("usage"), Mapping) else {}
    prompt = usage.get("prompt_tokens")
    return Observation(
        outcome=str(response.get("outcome", "unknown")),
        finish_reasons=tuple(c.get("finish_reason") for c in choices),
        choice_tokens=counts,
        output_tokens=response.get("output_tokens"),
        exact_tokens=_exact_tokens(usage, response, ids),
        token_ids=tuple(tuple(i) for i in id_lists) if ids and len(id_lists) == len(ids) else None,
        texts=tuple(strings) if texts and len(strings) == len(texts) else None,
        truncated=any(c.get("truncated") is True for c in choices),
        ttft_ms=None if first is None else (first - start) / 1e6,
        itl_ms=mean_itl_ms(first, itl_last, max(counts, default=0)),
        e2e_ms=None if end is None else (end - start) / 1e6,
        prompt_tokens=prompt if isinstance(prompt, int) else None,
        http_status=response.get("http_status"),
        error=response.get("error"),
        upstream_id=response.get("upstream_id"),
        timed_from="upstream_send" if sent is not None else "arrival",
    )


def _offset(value: Any) -> int | None:
    """A record's offset in ns: a non-negative integer, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


@attrs.frozen
class Divergence:
    """Where two outputs first differ."""

    choice: int
    position: int


@attrs.frozen
class Difference:
    """How ``other`` (candidate or baseline) differs from the primary, one request."""

    outcome_differs: bool
    finish_reason_differs: bool
    output_tokens_delta: int | None
    basis: str
    #: None when not compared (``basis == "none"``).
    output_equal: bool | None
    prefix: bool
    divergence: Divergence | None
    ttft_ratio: float | None
    itl_ratio: float | None
    e2e_ratio: float | None
    #: The deployment's reported prompt tokens differ from the record's token ids.
    prompt_tokens_differ: bool | None

    @property
    def output_tokens_differ(self) -> bool:
        return bool(self.output_tokens_delta)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome_differs": self.outcome_differs,
            "finish_reason_differs": self.finish_reason_differs,
            "output_tokens_delta": self.output_tokens_delta,
            "basis": self.basis,
            "output_equal": self.output_equal,
            "prefix": self.prefix,
            "divergence": None
            if self.divergence is None
            else {"choice": self.divergence.choice, "position": self.divergence.position},
            "ttft_ratio": _round(self.ttft_ratio),
            "itl_ratio": _round(self.itl_ratio),
            "e2e_ratio": _round(self.e2e_ratio),
            "prompt_tokens_differ": self.prompt_tokens_differ,
        }


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """First index where ``a`` and ``b`` differ; the shorter length when one is a
    prefix of the other; None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _outputs(
    primary: Observation, other: Observation
) -> tuple[str, Sequence[Sequence[Any]] | None, Sequence[Sequence[Any]] | None]:
    if primary.token_ids is not None and other.token_ids is not None:
        return "token_ids", primary.token_ids, other.token_ids
    if primary.texts is not None and other.texts is not None:
        return "text", primary.texts, other.texts
    return "none", None, None


def compare(primary: Observation, other: Observation, record_prompt_tokens: int) -> Difference:
    """How ``other`` differs from ``primary`` for one request."""
    if primary.outcome == "error" or other.outcome == "error":
        basis, mine, theirs = "error", None, None
    else:
        basis, mine, theirs = _outputs(primary, other)
    prefix = primary.outcome != "complete" or (basis == "token_ids" and primary.truncated)
    divergence: Divergence | None = None
    if mine is not None and theirs is not None:
        for index in range(max(len(mine), len(theirs))):
            a = mine[index] if index < len(mine) else ()
            b = theirs[index] if index < len(theirs) else ()
            if prefix:
                b = b[: len(a)]
            position = first_divergence(a, b)
            if position is not None:
                divergence = Divergence(index, position)
                break
    mine_count, their_count = _token_counts(primary, other)
    delta = None if mine_count is None or their_count is None else their_count - mine_count
    timed = primary.succeeded and other.succeeded  # a failed answer's latency means nothing
    return Difference(
        outcome_differs=primary.outcome != other.outcome,
        finish_reason_differs=primary.finish_reasons != other.finish_reasons,
        output_tokens_delta=delta,
        basis=basis,
        output_equal=None if mine is None else divergence is None,
        prefix=prefix,
        divergence=divergence,
        ttft_ratio=_ratio(other.ttft_ms, primary.ttft_ms) if timed else None,
        itl_ratio=_ratio(other.itl_ms, primary.itl_ms) if timed else None,
        e2e_ratio=_ratio(other.e2e_ms, primary.e2e_ms) if timed else None,
        prompt_tokens_differ=None
        if other.prompt_tokens is None
        else other.prompt_tokens != record_prompt_tokens,
    )


def _token_counts(primary: Observation, other: Observation) -> tuple[int | None, int | None]:
    """Both sides' exact output token counts (see the module doc)."""
    return primary.exact_tokens, other.exact_tokens


def _exact_tokens(usage: Mapping[str, Any], response: Mapping[str, Any], ids: list) -> int | None:
    completion = usage.get("completion_tokens")
    if isinstance(completion, int) and not isinstance(completion, bool):
        return completion
    upstream = response.get("token_ids_source") == "upstream"
    whole = not any(c.get("truncated") for c in response.get("choices", ()))
    if upstream and whole and ids and all(isinstance(i, list) for i in ids):
        return sum(map(len, ids))
    return None


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


#: Per-request fields judged Diffy-style: a candidate difference counts only
#: when the baseline does not show the same field differing for that request.
JUDGED_FIELDS = ("outcome", "finish_reason", "output_tokens", "output")


def differs(diff: Difference, field: str) -> bool:
    """Whether ``diff`` shows ``field`` differing (one of ``JUDGED_FIELDS``)."""
    if field == "outcome":
        return diff.outcome_differs
    if field == "finish_reason":
        return diff.finish_reason_differs
    if field == "output_tokens":
        return diff.output_tokens_differ
    if field == "output":
        return diff.output_equal is False
    msg = f"'field' must be one of {JUDGED_FIELDS} (got {field!r})"
    raise ValueError(msg)


def counted(candidate: Difference, baseline: Difference | None) -> dict[str, bool]:
    """Per judged field: the candidate differs, and the baseline (if any) does not."""
    return {
        f: differs(candidate, f) and (baseline is None or not differs(baseline, f))
        for f in JUDGED_FIELDS
    }
