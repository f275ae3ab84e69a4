"""Conversations among records, and a turn's prompt with the candidate's own answers.

Pure (no sockets). ``Conversations.place`` runs once per record a closed-loop
replay reads, in arrival order, and says which conversation the record is a
turn of and which turn:

- by the session id the proxy captured (``request.agent_context.session_id``,
  from the session headers of the allow-list; else ``image_cache_scope``);
- else by prefix chaining: a record whose prompt ids begin with the last
  prompt of an open conversation (turn k+1 resends turn k's prompt, then the
  answer, as the frontend rendered them) is its next turn; the oldest such
  conversation when several match (identical first turns);
- else it opens a conversation of its own.

At most ``max_open`` conversations are open; past that the one touched least
recently is closed (``evicted`` counts them), and a later turn of it starts a
conversation of its own.

``splice`` builds turn k+1's prompt: the recorded ids with the primary's answer
to every earlier turn i replaced by the candidate's, rendered in the frame the
records carry (``request.prompt_spans``, ``worker/request/spans.py``: each
record places its newest answer, the answer to the previous turn). It returns
a reason instead when it cannot, and the replay then sends that conversation
open-loop (``FALLBACK_REASONS``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

DEFAULT_MAX_OPEN = 4096
#: Prompts are indexed by their first ``_KEY_TOKENS`` ids for prefix chaining.
_KEY_TOKENS = 8

#: Why a conversation is replayed open-loop from some turn on:
#: ``no_spans``: a turn's record says nothing of where its answers sit (written
#: before the field existed, or a template whose answers cannot be placed);
#: ``answers``: a turn holds another number of answers than turns before it
#: (a conversation that began before the capture, or was regrouped);
#: ``tool_calls``: the candidate answered a tool-calling turn otherwise than the
#: primary (the tool results that follow answer the primary's calls);
#: ``candidate_failed``: the candidate failed a turn, there is no answer to send back.
FALLBACK_REASONS = ("no_spans", "answers", "tool_calls", "candidate_failed")


@attrs.frozen
class Answer:
    """What the candidate answered to one turn (and what the primary had)."""

    text: str | None
    token_ids: tuple[int, ...] | None = None
    primary_ids: tuple[int, ...] | None = None
    primary_text: str | None = None

    @property
    def same_as_primary(self) -> bool:
        if self.token_ids is not None and self.primary_ids is not None:
            return self.token_ids == self.primary_ids
        return self.text is not None and self.text == self.primary_text


@attrs.define(eq=False)
class Conversation:
    """One conversation's turns so far."""

    number: int
    #: ``session`` or ``prefix`` once a second turn joined; None while it has one.
    grouped_by: str | None = None
    turns: int = 0
    last_ids: tuple[int, ...] = ()
    session: str | None = None


def session_of(envelope: Mapping[str, Any]) -> str | None:
    """The session id the proxy captured for this record, if any."""
    request = envelope.get("request")
    if not isinstance(request, Mapping):
        return None
    context = request.get("agent_context")
    session = context.get("session_id") if isinstance(context, Mapping) else None
    if not isinstance(session, str):
        session = request.get("image_cache_scope")
    return session if isinstance(session, str) and session else None


def _ids_of(envelope: Mapping[str, Any]) -> tuple[int, ...]:
    request = envelope.get("request")
    ids = request.get("token_ids") if isinstance(request, Mapping) else None
    return tuple(ids) if isinstance(ids, list) else ()


class Conversations:
    """Places records in conversations (see the module docstring)."""

    def __init__(self, max_open: int = DEFAULT_MAX_OPEN) -> None:
        if max_open < 1:
            msg = f"'max_open' must be at least 1 (got {max_open})"
            raise ValueError(msg)
        self.max_open = max_open
        self.evicted = 0
        #: Records by how they were grouped: ``session``, ``prefix``, ``standalone``
        #: (a conversation of one record so far).
        self.records: Counter[str] = Counter()
        #: Conversations evicted since the last ``take_closed``.
        self._closed: list[Conversation] = []
        self._open: OrderedDict[int, Conversation] = OrderedDict()
        self._by_session: dict[str, Conversation] = {}
        self._by_key: dict[tuple[int, ...], list[Conversation]] = {}
        self._numbers = 0

    def place(self, envelope: Mapping[str, Any]) -> tuple[Conversation, int]:
        """The record's conversation and its turn index there (0: a first turn)."""
        ids = _ids_of(envelope)
        session = session_of(envelope)
        conversation = None
        how = "prefix"
        if session is not None:
            conversation, how = self._by_session.get(session), "session"
        if conversation is None:
            conversation, how = self._chained(ids), "prefix"
        if conversation is None:
            self._numbers += 1
            conversation = Conversation(self._numbers, session=session)
            if session is not None:
                self._by_session[session] = conversation
            self.records["standalone"] += 1
        else:
            self._unindex(conversation)
            if conversation.grouped_by is None:  # its first turn is grouped now too
                conversation.grouped_by = how
                self.records["standalone"] -= 1
                self.records[how] += 1
            self.records[conversation.grouped_by] += 1
        turn = conversation.turns
        conversation.turns += 1
        conversation.last_ids = ids
        self._open[conversation.number] = conversation
        self._open.move_to_end(conversation.number)
        self._by_key.setdefault(ids[:_KEY_TOKENS], []).append(conversation)
        while len(self._open) > self.max_open:
            _, oldest = self._open.popitem(last=False)
            self._unindex(oldest)
            if oldest.session is not None:
                self._by_session.pop(oldest.session, None)
            self.evicted += 1
            self._closed.append(oldest)
        return conversation, turn

    @property
    def opened(self) -> int:
        """Conversations opened so far (evicted ones included)."""
        return self._numbers

    def take_closed(self) -> list[Conversation]:
        """The conversations evicted since the last call (their holder may let go)."""
        closed, self._closed = self._closed, []
        return closed

    def _chained(self, ids: tuple[int, ...]) -> Conversation | None:
        for size in range(min(_KEY_TOKENS, len(ids)), 0, -1):  # shorter prompts: shorter keys
            for conversation in self._by_key.get(ids[:size], ()):
                last = conversation.last_ids
                if len(last) < len(ids) and ids[: len(last)] == last:
                    return conversation  # the list is oldest first
        return None

    def _unindex(self, conversation: Conversation) -> None:
        bucket = self._by_key.get(conversation.last_ids[:_KEY_TOKENS])
        if bucket is not None and conversation in bucket:
            bucket.remove(conversation)
            if not bucket:
                del self._by_key[conversation.last_ids[:_KEY_TOKENS]]


def newest_answer(envelope: Mapping[str, Any]) -> tuple[Mapping[str, Any], int] | None:
    """The record's span of its last assistant message and how many assistant
    messages it holds (``request.prompt_spans``), or None."""
    request = envelope.get("request")
    spans = request.get("prompt_spans") if isinstance(request, Mapping) else None
    answers = spans.get("answers") if isinstance(spans, Mapping) else None
    count = spans.get("assistants") if isinstance(spans, Mapping) else None
    if not isinstance(answers, list) or len(answers) != 1 or not isinstance(count, int):
        return None
    span = answers[0]
    return (span, count) if isinstance(span, Mapping) else None


def splice(
    ids: Sequence[int],
    spans: Sequence[Mapping[str, Any]],
    answers: Sequence[Answer],
    encode: Callable[[str], list[int]],
) -> list[int] | str:
    """``ids`` (a turn's recorded prompt) with the answer at ``spans[i]`` replaced
    by ``answers[i]`` (the candidate's answer to turn i of the conversation;
    the spans from the records of turns 1..k, valid in turn k's ids because each
    turn's prompt begins with the previous one's), or one of
    ``FALLBACK_REASONS``. A tool-calling answer is kept as recorded when the
    candidate answered it as the primary did."""
    if len(spans) != len(answers):
        return "answers"
    out = list(ids)
    ordered = sorted(zip(spans, answers, strict=True), key=lambda pair: -int(pair[0]["start"]))
    for span, answer in ordered:
        start, end = span.get("start"), span.get("end")
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(ids)):
            return "no_spans"
        if span.get("tool_calls"):
            if not answer.same_as_primary:
                return "tool_calls"
            continue
        before, after = span.get("before"), span.get("after")
        if not isinstance(before, str) or not isinstance(after, str):
            return "no_spans"
        if answer.text is None:
            return "candidate_failed"
        out[start:end] = encode(before + answer.text + after)
    return out


def think_ns(previous: Mapping[str, Any], following: Mapping[str, Any]) -> int:
    """What the proxy saw between the primary's answer to ``previous`` ending and
    ``following`` arriving (never negative; 0 when the records cannot say)."""
    response = previous.get("response")
    end = response.get("end_offset_ns") if isinstance(response, Mapping) else None
    start, then = previous.get("arrival_unix_ns"), following.get("arrival_unix_ns")
    if not all(isinstance(v, int) for v in (end, start, then)):
        return 0
    return max(0, then - (start + end))  # type: ignore[operator]
