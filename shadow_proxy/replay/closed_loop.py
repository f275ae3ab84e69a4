"""``shadow-replay --closed-loop``: each conversation waits for the candidate's answers.

One ``ClosedLoop`` per run. ``first_turns`` stands between the source and the
scheduler: it reads records ahead (in a task of its own), places each in its
conversation (``conversations.Conversations``), and hands the scheduler only
first turns (and records the runner will skip), so load across conversations
keeps the recorded schedule (``--speed`` applies). A later turn waits in its
conversation until the candidate's previous turn ended (``done``), then
``think_k`` more, the recorded gap between the primary's answer to turn k
ending and turn k+1 arriving, and goes out with the candidate's own answers in
place of the primary's (``conversations.splice``). A conversation that cannot be
spliced is replayed open-loop from that turn on: each turn at its recorded
offset from the conversation's first turn as it was sent (divided by
``--speed``), with the recorded prompt; the reason is counted once per
conversation.

Bounds: the reader holds at most ``max_pending`` later turns waiting for their
conversation (and waits while it would hold more); the scheduler's own queue
bounds the first turns; ``Conversations`` keeps at most ``max_open``
conversations, and their state here (the candidate's answers so far) is let
go of once an evicted one is idle; per-turn samples are bounded in
``turn_tally``; one float per conversation for its duration ratio. ``drain``
returns once every turn read was sent or counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import attrs

from shadow_proxy.replay.compare import Observation
from shadow_proxy.replay.conversations import (
    DEFAULT_MAX_OPEN,
    Answer,
    Conversation,
    Conversations,
    newest_answer,
    splice,
    think_ns,
)
from shadow_proxy.replay.request import CandidateRequest, Skip
from shadow_proxy.replay.turn_tally import TurnTally, median

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING = 4096

Build = Callable[[Mapping[str, Any]], CandidateRequest | Skip]
Send = Callable[[Any, CandidateRequest], Awaitable[None]]


@attrs.define(eq=False)
class _Turn:
    record: Any
    envelope: Mapping[str, Any]
    conversation: Conversation
    index: int
    think_ns: int = 0
    sent_ns: int | None = None
    #: Monotonic ns the candidate's previous turn ended (later turns only).
    after_ns: int | None = None


@attrs.define(eq=False)
class _Thread:
    """A conversation's state in this run."""

    pending: deque[_Turn] = attrs.field(factory=deque)
    answers: list[Answer] = attrs.field(factory=list)
    busy: bool = True
    ended_ns: int | None = None
    last: Mapping[str, Any] | None = None
    fallback: str | None = None
    first_sent_ns: int | None = None
    first_arrival: int | None = None
    #: The last turn the candidate answered.
    last_done: Mapping[str, Any] | None = None
    #: Evicted from ``Conversations``: let go of once idle.
    retired: bool = False
    #: The answers' spans so far (one from each later turn's record), and the
    #: recorded prompt of the last turn sent (a later one must begin with it).
    spans: list[Mapping[str, Any]] = attrs.field(factory=list)
    sent_ids: tuple[int, ...] = ()


class ClosedLoop:
    """Holds a run's conversations; see the module docstring."""

    def __init__(
        self,
        build: Build,
        send: Send,
        encode: Callable[[str], list[int]],
        speed: float | None,
        max_open: int = DEFAULT_MAX_OPEN,
        max_pending: int = DEFAULT_MAX_PENDING,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._build, self._send, self._encode = build, send, encode
        self._speed = speed
        self._clock = clock
        self.conversations = Conversations(max_open)
        self.max_pending = max_pending
        self._turns: dict[int, _Turn] = {}
        self._threads: dict[int, _Thread] = defaultdict(_Thread)
        self._pending = 0
        self._outstanding = 0
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.fell_back: Counter[str] = Counter()
        self.tally = TurnTally()
        #: Duration ratios of the conversations let go of (``_retire``).
        self._durations: list[float] = []

    # -- reading -----------------------------------------------------------------

    async def first_turns(self, records: AsyncIterable[Any]) -> AsyncIterator[Any]:
        """The records the scheduler paces: first turns, and those it will skip."""
        queue: asyncio.Queue[Any] = asyncio.Queue(64)
        end = object()

        async def read() -> None:
            try:
                async for record in records:
                    first = await self._place(record)
                    if first:
                        await queue.put(record)
            finally:
                await queue.put(end)

        reader = asyncio.create_task(read(), name="closed-loop-reader")
        try:
            while (record := await queue.get()) is not end:
                yield record
            await reader  # its failure is the source's
        finally:
            reader.cancel()

    async def _place(self, record: Any) -> bool:
        envelope = _envelope(record)
        if isinstance(self._build(envelope), Skip):
            return True  # the runner counts it
        conversation, index = self.conversations.place(envelope)
        for closed in self.conversations.take_closed():
            self._retire(closed.number)
        turn = _Turn(record, envelope, conversation, index)
        self._turns[id(envelope)] = turn
        self._outstanding += 1
        if index == 0:
            ids = envelope["request"]["token_ids"]
            self._threads[conversation.number] = _Thread(
                first_arrival=_arrival(envelope), last=envelope, sent_ids=tuple(ids)
            )
            return True
        while self._pending >= self.max_pending:
            self._changed.clear()
            await self._changed.wait()
        thread = self._threads[conversation.number]
        turn.think_ns = think_ns(thread.last, envelope) if thread.last is not None else 0
        thread.last = envelope
        thread.pending.append(turn)
        self._pending += 1
        if not thread.busy:
            self._next(thread)
        return False

    # -- sending -----------------------------------------------------------------

    def sending(self, envelope: Mapping[str, Any]) -> None:
        """A turn goes out now (called by the runner just before it sends)."""
        turn = self._turns.get(id(envelope))
        if turn is None:
            return
        turn.sent_ns = self._clock()
        thread = self._threads[turn.conversation.number]
        if turn.index == 0:
            thread.first_sent_ns = turn.sent_ns

    def done(self, envelope: Mapping[str, Any], candidate: Observation | None) -> None:
        """The candidate's answer to a turn ended (None: it was not sent)."""
        turn = self._turns.pop(id(envelope), None)
        if turn is None:
            return
        self._outstanding -= 1
        thread = self._threads[turn.conversation.number]
        thread.busy = False
        thread.ended_ns = self._clock()
        if candidate is None or not candidate.succeeded or not candidate.texts:
            self._fall_back(thread, "candidate_failed")
            answer = Answer(None)
        else:
            primary = _primary_choice(envelope)
            answer = Answer(
                candidate.texts[0],
                candidate.token_ids[0] if candidate.token_ids else None,
                primary[0],
                primary[1],
            )
        thread.answers.append(answer)
        thread.last_done = envelope
        if thread.pending:
            self._next(thread)
        elif thread.retired:
            self._retire(turn.conversation.number)
        self._changed.set()

    def _retire(self, number: int) -> None:
        """Let go of an evicted conversation once it is idle (its duration kept)."""
        thread = self._threads.get(number)
        if thread is None:
            return
        if thread.busy or thread.pending:
            thread.retired = True
            return
        ratio = _duration_ratio(thread)
        if ratio is not None:
            self._durations.append(ratio)
        del self._threads[number]

    def _next(self, thread: _Thread) -> None:
        turn = thread.pending.popleft()
        self._pending -= 1
        thread.busy = True
        turn.after_ns = thread.ended_ns
        task = asyncio.create_task(self._follow(thread, turn), name="closed-loop-turn")
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._changed.set()

    async def _follow(self, thread: _Thread, turn: _Turn) -> None:
        try:
            await self._follow_turn(thread, turn)
        except Exception as exc:  # a bug must not leave the run waiting for this turn
            log.error("closed loop: a turn failed: %s: %s", type(exc).__name__, exc)
            self._fall_back(thread, "candidate_failed")
            self.done(turn.envelope, None)

    async def _follow_turn(self, thread: _Thread, turn: _Turn) -> None:
        built = self._build(turn.envelope)
        assert isinstance(built, CandidateRequest)
        request = built
        if thread.fallback is None:
            spliced = self._splice(thread, turn)
            if isinstance(spliced, str):
                self._fall_back(thread, spliced)
            else:
                body = {**built.body, "prompt": spliced}
                request = attrs.evolve(built, body=body, prompt_tokens=len(spliced))
        now = self._clock()
        due = self.due_ns(thread, turn, now)
        if due > now:
            await asyncio.sleep((due - now) / 1e9)
        if thread.fallback is None and turn.after_ns is not None:
            waited = self._clock() - turn.after_ns
            self.tally.think_error((waited - turn.think_ns) / 1e6)
        await self._send(turn.record, request)

    def due_ns(self, thread: _Thread, turn: _Turn, now: int) -> int:
        """When a later turn goes out: its think time after the candidate's
        previous answer ended; open-loop, its recorded offset from the
        conversation's first turn as sent (over ``--speed``), or now."""
        if thread.fallback is None:
            return (turn.after_ns or now) + turn.think_ns
        if self._speed is None or thread.first_sent_ns is None:
            return now
        offset = _arrival(turn.envelope) - (thread.first_arrival or _arrival(turn.envelope))
        return thread.first_sent_ns + int(offset / self._speed)

    def _splice(self, thread: _Thread, turn: _Turn) -> list[int] | str:
        """The turn's prompt with the candidate's answers, or why not."""
        ids = turn.envelope["request"]["token_ids"]
        newest = newest_answer(turn.envelope)
        if newest is None:
            return "no_spans"
        span, assistants = newest
        previous = thread.sent_ids
        if assistants != len(thread.answers) or list(ids[: len(previous)]) != list(previous):
            return "answers"  # not the next turn of what was sent (history edited, turns missed)
        thread.spans.append(span)
        thread.sent_ids = tuple(ids)
        return splice(ids, thread.spans, thread.answers, self._encode)

    def _fall_back(self, thread: _Thread, reason: str) -> None:
        if thread.fallback is None:
            thread.fallback = reason
            self.fell_back[reason] += 1

    async def drain(self) -> None:
        """Wait until every turn read was sent (or counted)."""
        while self._outstanding > 0 or self._tasks:
            self._changed.clear()
            if self._outstanding <= 0 and not self._tasks:
                break
            await self._changed.wait()

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    # -- what it saw ------------------------------------------------------------

    def line(self, envelope: Mapping[str, Any]) -> dict[str, Any]:
        """The closed-loop fields of a pair line."""
        turn = self._turns.get(id(envelope))
        if turn is None:
            return {}
        thread = self._threads[turn.conversation.number]
        out: dict[str, Any] = {
            "conversation": turn.conversation.number,
            "turn": turn.index,
            "closed_loop": thread.fallback is None,
        }
        if turn.index:
            out["think_ms"] = round(turn.think_ns / 1e6, 3)
            if turn.after_ns is not None and turn.sent_ns is not None:
                out["waited_ms"] = round((turn.sent_ns - turn.after_ns) / 1e6, 3)
        return out

    def observe(
        self, envelope: Mapping[str, Any], primary: Observation | None, candidate: Observation
    ) -> None:
        """Count a turn's pair (not called for warm-up turns)."""
        turn = self._turns.get(id(envelope))
        if turn is not None:
            self.tally.observe(turn.index, primary, candidate)

    def summary(self) -> dict[str, Any]:
        """summary.json's ``closed_loop``."""
        grouped = self.conversations.records
        durations = [*self._durations, *filter(None, map(_duration_ratio, self._threads.values()))]
        return {
            "conversations": self.conversations.opened,
            "records": {
                "grouped_by_session": grouped["session"],
                "grouped_by_prefix": grouped["prefix"],
                "standalone": grouped["standalone"],
            },
            "fell_back_open_loop": dict(self.fell_back),
            "evicted": self.conversations.evicted,
            "turns_completed": self.tally.completed,
            "duration_ratio_p50": median(durations),
            "duration_ratio_n": len(durations),
            "think_error_ms": self.tally.think_summary(),
            "per_turn": self.tally.per_turn(),
        }


def _duration_ratio(thread: _Thread) -> float | None:
    """A conversation the candidate answered at least two turns of, closed-loop
    throughout: its duration (first send to last answer's end) over the
    primary's (first arrival to last answer's end)."""
    last, start = thread.last_done, thread.first_sent_ns
    if thread.fallback or len(thread.answers) < 2 or last is None or start is None:
        return None
    response = last.get("response")
    end = response.get("end_offset_ns") if isinstance(response, Mapping) else None
    if not isinstance(end, int) or thread.ended_ns is None or thread.first_arrival is None:
        return None
    primary = _arrival(last) + end - thread.first_arrival
    return (thread.ended_ns - start) / primary if primary > 0 else None


def _envelope(record: Any) -> Mapping[str, Any]:
    return record if isinstance(record, Mapping) else record.envelope


def _arrival(envelope: Mapping[str, Any]) -> int:
    arrival = envelope.get("arrival_unix_ns")
    return arrival if isinstance(arrival, int) else 0


def _primary_choice(envelope: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, str | None]:
    response = envelope.get("response")
    choices = response.get("choices") if isinstance(response, Mapping) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None, None
    ids, text = choices[0].get("token_ids"), choices[0].get("text")
    return (
        tuple(ids) if isinstance(ids, list) else None,
        text if isinstance(text, str) else None,
    )
