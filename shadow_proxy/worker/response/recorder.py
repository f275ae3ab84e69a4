"""One response, read as the client received it: stream interpretation per choice.

Runs in the tap worker. The serving loop forwards the frontend's bytes untouched
and hands the worker a copy: ``head`` once the response headers arrived, ``feed``
for each body chunk (exact read boundaries, still content-encoded, with its
monotonic offset from arrival), ``finish`` with the ``EndKind`` when the exchange
is over, however it ended. ``finish`` returns an ``ObservedResponse``
(``observed.py``); the outcome rules are ``outcome.py``, the content decoding
``decoding.py``, the SSE framing ``sse.py``, what the events and body say
``content.py``.

What is read from the body: each chat or completions object per choice
(``chat_object.py``: text, tool calls, upstream token ids, content chunks,
finish reasons); per response the first ``id`` (``upstream_id``), the last
``usage`` seen (usage-only chunks included), error events and bodies,
``[DONE]``. Dynamo's response ``nvext.token_ids`` is *not* used: it holds the
tokenized prompt (GAIE query-only flow), not output tokens. A ``/v1/responses``
answer (typed events, or the ``response`` object) is read by
``responses_events.py`` into choice 0 instead; everything else here applies to
it unchanged.

Memory bound per in-flight recorder (defaults in parentheses; every cap is a
constructor argument):

- SSE parser: one event, at most ``max_event_bytes`` (8 MiB), plus the decoded
  piece being parsed (at most ``decoding.DECODE_STEP`` = 256 KiB per step, or
  the raw chunk when not encoded);
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

Worst case, all caps reached: about 28 MiB for a stream (16 MiB of body instead
of the SSE buffer for a unary response), plus the transient Python objects of
the one JSON event or body being decoded. What typical responses hold is
measured by ``bench/recorder_memory.py`` (figures in docs/metrics.md, "Bounds").
"""

from __future__ import annotations

import time

from shadow_proxy.channel.handoff import Pieces
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.worker.budget import WorkBudget
from shadow_proxy.worker.response import outcome
from shadow_proxy.worker.response.choices import ChoiceTable
from shadow_proxy.worker.response.content import BodyContent
from shadow_proxy.worker.response.decoding import BodyDecoder, DecodeError, for_header
from shadow_proxy.worker.response.observed import ObservedResponse, without_none
from shadow_proxy.worker.response.outcome import clip
from shadow_proxy.worker.response.sse import DEFAULT_MAX_EVENT_BYTES, SSEParser

KIB = 1024
MIB = 1024 * KIB

DEFAULT_MAX_TEXT_BYTES_PER_CHOICE = 2 * MIB
DEFAULT_MAX_TEXT_BYTES_TOTAL = 8 * MIB
DEFAULT_MAX_TOKEN_IDS_PER_CHOICE = 1 << 20
DEFAULT_MAX_TOKEN_IDS_TOTAL = 1 << 21
DEFAULT_MAX_UNARY_BYTES = 16 * MIB
DEFAULT_MAX_CHUNK_OFFSETS = 1 << 18
DEFAULT_MAX_CHOICES = 128
#: The CPU deadline is checked once this many decoded bytes were read since the last
#: check: after every piece a compressed chunk decodes to (``DECODE_STEP``, 256 KiB),
#: once per ~300 events of a plain stream (reading the clock costs what an event does).
CLOCK_BYTES = 64 * KIB


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
        max_decoded_bytes: int | None = None,
        max_events: int | None = None,
    ) -> None:
        self.route = route
        self.n = max(1, n)
        self.chunk_timing = chunk_timing
        self._max_event_bytes = max_event_bytes
        self._max_unary = max_unary_bytes
        #: Work budget: bytes a content-encoded body may decode to (None: no bound).
        self._max_decoded = max_decoded_bytes
        self._decoded = 0
        #: Work budget: SSE events the request can account for (None: no bound).
        self._max_events = max_events
        self._events = 0
        #: Work budget: the ``time.thread_time()`` past which the body is read no
        #: further (``cpu_deadline``, checked per ``CLOCK_BYTES`` read since it was
        #: set: the shard checks the budget before and after each message), and
        #: the reason then given.
        self._deadline: float | None = None
        self._unclocked = 0  # decoded bytes read since the clock was last read
        self.cpu_reason = "work budget: CPU time"
        #: Why the body was read no further (a work budget), or None; and which
        #: budget.
        self.gave_up: str | None = None
        self.gave_up_on: str | None = None

        self._status: int | None = None
        self._decoder: BodyDecoder | None = None
        self._sse: SSEParser | None = None
        self._body: bytearray | None = None  # unary body
        self._sniff = False  # no head seen: decide SSE or JSON from the first bytes
        self._ignoring = False  # the unary body went over its cap: ignore the rest
        self._encoding = "identity"
        self._last_offset: int | None = None
        self._sent: int | None = None
        self._result: ObservedResponse | None = None

        self._choices = ChoiceTable(
            max_text_bytes_per_choice=max_text_bytes_per_choice,
            max_text_bytes_total=max_text_bytes_total,
            max_token_ids_per_choice=(
                DEFAULT_MAX_TOKEN_IDS_PER_CHOICE
                if max_token_ids_per_choice is None
                else max_token_ids_per_choice
            ),
            max_token_ids_total=max_token_ids_total,
            max_choices=max_choices,
        )
        self._undecodable = 0
        self._problem: str | None = None
        self._content = BodyContent(
            route, self._choices, chunk_timing=chunk_timing, max_chunk_offsets=max_chunk_offsets
        )

    @property
    def cpu_deadline(self) -> float | None:
        return self._deadline

    @cpu_deadline.setter
    def cpu_deadline(self, deadline: float | None) -> None:
        self._deadline = deadline
        self._unclocked = 0

    # -- the three calls ------------------------------------------------------------

    def head(
        self,
        status: int,
        content_type: str,
        content_encoding: str,
        offset_ns: int,
        sent_offset_ns: int = 0,
    ) -> None:
        """The response headers arrived (``sent_offset_ns`` after arrival the
        request went to the frontend; 0: it did not). Only the first call counts."""
        if self._status is not None or self._result is not None:
            return
        self._status = status
        self._sent = sent_offset_ns or None
        media = content_type.split(";", 1)[0].strip().lower()
        if media == "text/event-stream":
            self._sse = SSEParser(self._max_event_bytes)
        else:
            self._body = bytearray()
        self._decoder = for_header(content_encoding)
        if self._decoder is None:
            self._problem = f"content-encoding {content_encoding.strip()!r} not decodable"
        else:
            self._encoding = self._decoder.kind

    def feed(self, data: bytes, offset_ns: int) -> None:
        """A body chunk the client was sent, ``offset_ns`` after arrival."""
        if self._result is not None or self._ignoring or not data:
            return
        if self._status is None and self._decoder is None:
            self._decoder = BodyDecoder("identity")
            self._sniff = True
        self._last_offset = offset_ns
        if self._decoder is None:
            self._undecodable += len(data)
            return
        limit = self._max_decoded if self._decoder.kind != "identity" else None
        deadline = self._deadline
        try:
            for piece in self._decoder.decode(data):
                if limit is not None:
                    self._decoded += len(piece)
                    if self._decoded > limit:
                        self.give_up(
                            f"work budget: body decodes to over {limit} bytes",
                            WorkBudget.DECODED,
                        )
                        return
                self._consume(piece, offset_ns)
                if self._ignoring or (deadline is not None and self._clock(len(piece))):
                    return
        except DecodeError as exc:
            self._decoder = None
            self._undecodable += len(data)
            self._problem = clip(f"corrupt {self._encoding} body: {exc}")
            self._body = None

    def feed_many(self, data: Pieces, offsets: list[int]) -> None:
        """``feed`` of each of a message's chunks in turn (the same record, for
        less CPU): the chunks of an unencoded stream that hold whole one-line
        data events (Dynamo's and vLLM's) are read at once (``_batch``)."""
        sse, decoder = self._sse, self._decoder
        if (
            sse is None
            or decoder is None
            or decoder.kind != "identity"
            or self._content.responses is not None
            or self._result is not None
            or self._ignoring
            or not self._batch(data, offsets)
        ):
            for chunk, offset in zip(data.split(), offsets, strict=True):
                self.feed(chunk, offset)

    def _batch(self, data: Pieces, offsets: list[int]) -> bool:
        """``feed_many``'s chunks read at once, when they complete one-line data
        events (``SSEParser.whole_events``, ``BodyContent.whole``) and the events
        budget takes them all. False, and nothing read, otherwise."""
        sse = self._sse
        assert sse is not None
        whole = sse.whole_events(data)
        if whole is None:
            return False
        limit = self._max_events
        if limit is not None and self._events + whole.count > limit:
            return False
        if not self._content.whole(whole, offsets):
            return False
        sse.take(whole)
        self._events += whole.count
        self._last_offset = offsets[-1]
        if self._deadline is not None:
            self._clock(len(whole.text))
        return True

    def _clock(self, read: int) -> bool:
        """``read`` more bytes against the CPU deadline (the clock is read once per
        ``CLOCK_BYTES``); True when it has passed and the body is given up."""
        self._unclocked += read
        if self._unclocked < CLOCK_BYTES:
            return False
        self._unclocked = 0
        deadline = self._deadline
        if deadline is None or time.thread_time() <= deadline:
            return False
        self.give_up(self.cpu_reason, WorkBudget.CPU)
        return True

    def give_up(self, reason: str, budget: WorkBudget) -> None:
        """Read no more of the body (``budget`` is spent): the record carries what
        was read so far, its outcome ``incomplete`` with ``reason`` unless the
        response had already failed or finished."""
        if self._result is not None or self._ignoring:
            return
        self._ignoring = True
        self.gave_up = reason
        self.gave_up_on = budget
        if self._problem is None:
            self._problem = reason
        self._body = None

    def finish(self, end: EndKind, offset_ns: int, detail: str = "") -> ObservedResponse:
        """The exchange is over: settle the outcome. Idempotent (later calls return
        the first result)."""
        if self._result is not None:
            return self._result
        if self._sse is not None:
            self._sse.close()
        elif self._body is not None and self._problem is None:
            self._content.unary(self._body, self._last_offset, self._status)
            self._body = None
        content = self._content
        content.settle()
        outcome, error = self._outcome(end, detail)
        sse = self._sse
        self._result = ObservedResponse(
            outcome=outcome,
            http_status=self._status,
            error=error,
            upstream_id=content.upstream_id,
            usage=without_none(content.usage) if content.usage else None,
            choices=self._choices.observed(),
            first_token_offset_ns=content.first,
            last_token_offset_ns=content.last,
            end_offset_ns=offset_ns,
            upstream_sent_offset_ns=self._sent,
            streamed=None if self._status is None else sse is not None,
            chunk_offsets_ns=content.offsets,
            end=end,
            n=self.n,
            events=sse.events if sse else 0,
            malformed_events=content.malformed,
            oversized_events=sse.oversized_events if sse else 0,
            truncated_events=sse.truncated_events if sse else 0,
            ignored_choices=self._choices.ignored,
            undecodable_bytes=self._undecodable,
            body_problem=self._problem,
            done_seen=content.done,
            dropped_chunk_offsets=content.dropped_offsets,
        )
        self._choices.clear()
        self._sse = None
        return self._result

    # -- body ----------------------------------------------------------------------

    def _room(self, events: int) -> int:
        """Count ``events`` more; how many of them the events budget still takes."""
        before = self._events
        self._events += events
        limit = self._max_events
        return events if limit is None else max(0, min(events, limit - before))

    def _over_events(self) -> None:
        limit = self._max_events
        self.give_up(
            f"work budget: over {limit} events, more than max_tokens accounts for",
            WorkBudget.EVENTS,
        )

    def _consume(self, piece: bytes, offset_ns: int) -> None:
        if self._sniff:
            self._sniff = False
            start = piece.lstrip(b"\xef\xbb\xbf \t\r\n")[:6]
            if start.startswith((b"data:", b"event:", b":", b"id:")):
                self._sse = SSEParser(self._max_event_bytes)
            else:
                self._body = bytearray()
        if self._sse is not None:
            content = self._content
            # Whole one-line data events (Dynamo's and vLLM's chunks): their bytes,
            # without an SSEEvent each; anything else through the full parser.
            values = self._sse.whole_data(piece) if content.responses is None else None
            if values is not None:
                room = self._room(len(values))
                for value in values[:room] if room < len(values) else values:
                    content.data(value, offset_ns)
                if room < len(values):
                    self._over_events()
                return
            for event in self._sse.feed(piece):
                if not self._room(1):
                    self._over_events()
                    return
                content.event(event, offset_ns)
        elif self._body is not None:
            if len(self._body) + len(piece) > self._max_unary:
                self._problem = f"body over {self._max_unary} bytes"
                self._body = None
                self._ignoring = True
            else:
                self._body += piece

    # -- the end ----------------------------------------------------------------------

    def _outcome(self, end: EndKind, detail: str) -> tuple[str, str | None]:
        finished = self._choices.finish_reasons()
        problem = self._problem if self._decoder is not None else (self._problem or "")
        return outcome.decide(
            end,
            detail,
            status=self._status,
            error=self._content.error,
            finished=finished,
            n=self.n,
            problem=problem,
        )
