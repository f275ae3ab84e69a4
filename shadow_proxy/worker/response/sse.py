"""Incremental Server-Sent Events parser: bytes in, events out.

Runs in the tap worker on a copy of every chunk of every streamed response, so it
works on whole lines with bytes methods (``splitlines``), never byte by byte.
Chunks may split the stream anywhere: inside a multi-byte UTF-8 character (lines
are decoded only once complete, and a line terminator is never part of a
multi-byte sequence), between ``\\r`` and ``\\n``, or inside the leading BOM.

It follows the WHATWG HTML "event stream interpretation" rules (``\\n``, ``\\r\\n``
and ``\\r`` line ends; ``:`` comment lines; ``data`` lines joined with ``\\n``; one
space after the colon removed if present; ``event``, ``id`` and ``retry`` fields;
one leading UTF-8 BOM skipped; a final event without its blank line discarded),
with two deliberate differences, because it observes a stream rather than
serving a browser:

- an event with an ``event:`` field but no ``data:`` line is dispatched (a
  browser drops it): Dynamo reports a worker that died mid-stream as
  ``event: error`` with the message in a comment line and no data;
- comment lines inside an event are kept on it (``SSEEvent.comments``); a block
  of comments alone (a keep-alive) is dropped.

Bounded memory: one event (its lines, each counted as its bytes plus
``LINE_OVERHEAD`` for the Python object that holds it, and the unterminated line
still arriving) never exceeds ``max_event_bytes``; at most ``MAX_COMMENTS``
comment lines are kept per event. A larger event is
dropped as soon as it crosses the cap, the rest of it is skipped up to its blank
line without being buffered, and ``oversized_events`` counts it. Peak use is
``max_event_bytes`` plus the chunk being fed (plus the decoded ``str`` of the
lines of one event).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Sequence

import attrs

from shadow_proxy.channel.handoff import Pieces

DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024

#: What a kept line costs beyond its bytes (the ``str`` header and its list slot),
#: counted against the cap so that many short lines cannot hide behind it.
LINE_OVERHEAD = 64
#: Comment lines kept per event (they only explain errors); later ones are ignored.
MAX_COMMENTS = 8

_BOM = b"\xef\xbb\xbf"
_CR = 0x0D
_LF = 0x0A


@attrs.frozen
class SSEEvent:
    """One dispatched event. ``data`` is the ``data`` lines joined with ``\\n``;
    ``event`` is ``"message"`` unless the stream named it; ``id`` is the last
    event id seen so far in the stream (WHATWG semantics)."""

    data: str
    event: str = "message"
    id: str = ""
    comments: tuple[str, ...] = ()


@attrs.frozen
class WholeEvents:
    """The events a hand-off message completes (``SSEParser.whole_events``), split
    at their blank lines; whether each is one ``data: `` line is ``valid``'s to say."""

    #: The bytes they were read from: the events up to ``end``, then the start of
    #: the next one.
    text: bytes
    #: Each event without its blank line.
    events: list[bytes]
    end: int
    #: Where each chunk of the message ends in ``text`` (after the unterminated
    #: line carried over from earlier chunks).
    bounds: list[int]

    @property
    def count(self) -> int:
        return len(self.events)

    def valid(self, start: int = 0) -> bool:
        """Whether ``events[start:]`` are each one ``data: `` line (no other line
        end, no ``\\r``)."""
        events = self.events[start:]
        if not events:
            return True
        region = self.end - sum(map(len, events)) - 2 * len(events)
        return (
            all(map(bytes.startswith, events, itertools.repeat(b"data: ")))
            and self.text.count(b"\n", region, self.end) == 2 * len(events)
            and self.text.find(b"\r", region, self.end) < 0
        )

    def array(self, start: int = 0, stop: int | None = None) -> bytes:
        """The values of ``events[start:stop]`` as one JSON array: ``[value,...]``."""
        return b"[" + b",".join(map(_VALUE, self.events[start:stop])) + b"]"

    def chunk_at(self, at: int) -> int:
        """The index of the chunk byte ``at`` of ``text`` came in."""
        return bisect.bisect_right(self.bounds, at)

    def arrivals(self, offsets: Sequence[int]) -> Arrivals:
        """When each event came, ``offsets[i]`` being the i-th chunk's: found for
        the events asked about only (most reads want the first and the last)."""
        return Arrivals(self, offsets)


class Arrivals:
    """``at[i]``: the offset of the chunk event ``i``'s blank line ended in."""

    __slots__ = ("_ends", "_offsets", "_whole")

    def __init__(self, whole: WholeEvents, offsets: Sequence[int]) -> None:
        self._whole = whole
        self._offsets = offsets
        # The last byte of each event's blank line: its end, minus one.
        self._ends = list(itertools.accumulate(map(_PLUS_TWO, map(len, whole.events)), initial=-1))

    def __getitem__(self, i: int) -> int:
        return self._offsets[self._whole.chunk_at(self._ends[i + 1])]


#: An event's value: what follows ``data: ``.
_VALUE = operator.itemgetter(slice(6, None))
_PLUS_TWO = (2).__add__


class SSEParser:
    """Feed bytes in arbitrary chunks; get back the events they complete.

    ``feed`` never raises on stream content: invalid UTF-8 is replaced (U+FFFD),
    unknown fields are ignored, oversized events are counted and dropped.
    ``close`` at end of stream discards an unfinished event (counted in
    ``truncated_events``).
    """

    __slots__ = (
        "_comments",
        "_data",
        "_discarding",
        "_event",
        "_pending_bom",
        "_size",
        "_skip_lf",
        "_skip_line",
        "_tail",
        "_tail_len",
        "events",
        "last_event_id",
        "max_event_bytes",
        "oversized_events",
        "retry_ms",
        "truncated_events",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes < 1:
            msg = f"'max_event_bytes' must be at least 1 (got {max_event_bytes})"
            raise ValueError(msg)
        self.max_event_bytes = max_event_bytes
        #: Events dispatched so far.
        self.events = 0
        #: Events dropped because they grew over ``max_event_bytes``.
        self.oversized_events = 0
        #: Events the stream left unfinished (no blank line before its end).
        self.truncated_events = 0
        self.last_event_id = ""
        self.retry_ms: int | None = None
        # The unterminated last line, as the pieces that arrived (joined once,
        # when its terminator arrives: no quadratic re-copying of a long line).
        self._tail: list[bytes] = []
        self._tail_len = 0
        # The previous chunk ended with "\r": a "\n" opening this one ends nothing.
        self._skip_lf = False
        # Nothing decoded yet: a BOM may still be arriving.
        self._pending_bom = True
        # The current event went over the cap: skip its lines up to the blank line.
        self._discarding = False
        # The unterminated line belongs to a discarded event: its bytes are not
        # kept, and the next line end only closes it.
        self._skip_line = False
        # The event being assembled.
        self._data: list[str] = []
        self._event = ""
        self._comments: list[str] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by ``chunk``, in stream order."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if not self._pending_bom and b"\n" not in chunk and b"\r" not in chunk:
            self._extend_line(chunk)
            return []
        if self._tail:
            self._tail.append(chunk)
            chunk = b"".join(self._tail)
            self._tail = []
            self._tail_len = 0
        if self._pending_bom:
            if len(chunk) < len(_BOM) and _BOM.startswith(chunk):
                self._tail = [chunk]
                self._tail_len = len(chunk)
                return []
            self._pending_bom = False
            if chunk.startswith(_BOM):
                chunk = chunk[len(_BOM) :]
                if not chunk:
                    return []
        lines = chunk.splitlines()
        last = chunk[-1]
        rest = None
        if last == _CR:
            self._skip_lf = True
        elif last != _LF:
            rest = lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            if self._skip_line:
                self._skip_line = False
            elif not line:
                self._dispatch(events)
            elif not self._discarding:
                if line[0] == 0x3A and len(self._comments) >= MAX_COMMENTS:
                    continue
                self._size += len(line) + LINE_OVERHEAD
                if self._size > self.max_event_bytes:
                    self._discard()
                else:
                    self._field(line)
        if rest is not None:
            self._extend_line(rest)
        return events

    def whole_data(self, chunk: bytes) -> list[bytes] | None:
        """When ``chunk`` is nothing but whole one-line ``data`` events (each
        ``data:`` + value + ``\\n\\n``, no ``\\r``) and no event is under way:
        their values as bytes (one space after the colon removed), counted as
        dispatched, exactly what ``feed`` would make of them. Otherwise None, and
        nothing changed: ``feed`` then reads the chunk."""
        if (
            self._size  # an event under way (each of its lines counted in _size)
            or self._tail
            or self._skip_lf
            or self._pending_bom
            or self._discarding
            or self._skip_line
            or not chunk.endswith(b"\n\n")
            or not chunk.startswith(b"data:")
            or b"\r" in chunk
        ):
            return None
        lines = chunk.count(b"\n")
        if lines == 2:  # one event: the usual chunk
            if len(chunk) - 2 > self.max_event_bytes - LINE_OVERHEAD:
                return None
            self.events += 1
            return [chunk[6:-2] if chunk[5] == 0x20 else chunk[5:-2]]
        events = chunk.split(b"\n\n")
        events.pop()  # the empty piece after the last blank line
        if lines != 2 * len(events):
            return None
        values = []
        limit = self.max_event_bytes - LINE_OVERHEAD
        for line in events:
            if not line.startswith(b"data:") or len(line) > limit:
                return None
            values.append(line[6:] if line[5:6] == b" " else line[5:])
        self.events += len(values)
        return values

    def whole_events(self, pieces: Pieces) -> WholeEvents | None:
        """When a message's chunks (after the unterminated line left from earlier
        ones) complete events that start a line (no event under way), each
        within the event cap, and leave at most the start of a ``data: `` line
        (no line end, no ``\\r``): those events, split at their blank lines
        (``WholeEvents``; ``valid`` says whether each is one ``data: `` line),
        read from the message's joined bytes without splitting them into
        chunks. Nothing changes until ``take``; otherwise None, and ``feed``
        reads the chunks."""
        if self._size or self._skip_lf or self._discarding or self._skip_line:
            return None
        joined = pieces.joined
        tail = self._tail_len
        if tail:
            joined = b"".join(self._tail) + joined
        last = joined.rfind(b"\n\n")
        if (
            last < 0
            or not joined.startswith(b"data: ")
            or last + LINE_OVERHEAD > self.max_event_bytes  # so each event is under the cap
            or len(joined) - last - 2 > self.max_event_bytes  # and the line still arriving
            or joined.find(b"\n", last + 2) >= 0
            or joined.find(b"\r", last + 2) >= 0
        ):
            return None
        bounds = list(itertools.accumulate(pieces.lengths, initial=tail))[1:]
        return WholeEvents(joined, joined[:last].split(b"\n\n"), last + 2, bounds)

    def take(self, whole: WholeEvents) -> None:
        """``whole`` was read: count its events as dispatched, keep what follows."""
        self.events += whole.count
        self._pending_bom = False  # the stream begins with "data: ", not a BOM
        rest = whole.text[whole.end :]
        self._tail = [rest] if rest else []
        self._tail_len = len(rest)

    def close(self) -> None:
        """End of stream: an event without its closing blank line is discarded."""
        if self._data or self._event or self._comments or self._tail or self._discarding:
            self.truncated_events += 1
        self._reset()
        self._tail = []
        self._tail_len = 0
        self._skip_line = False

    def _extend_line(self, piece: bytes) -> None:
        """Add an unterminated piece to the last line, or skip it if discarded."""
        if self._skip_line:
            return
        if self._discarding:
            self._skip_line = True
            return
        self._tail.append(piece)
        self._tail_len += len(piece)
        if self._size + self._tail_len > self.max_event_bytes:
            self._tail = []
            self._tail_len = 0
            self._skip_line = True
            self._discard()

    def _discard(self) -> None:
        self._data = []
        self._event = ""
        self._comments = []
        self._size = 0
        self._discarding = True

    def _reset(self) -> None:
        self._data = []
        self._event = ""
        self._comments = []
        self._size = 0
        self._discarding = False

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._discarding:
            self.oversized_events += 1
        elif self._data or self._event:
            events.append(
                SSEEvent(
                    "\n".join(self._data),
                    self._event or "message",
                    self.last_event_id,
                    tuple(self._comments),
                )
            )
            self.events += 1
        self._reset()

    def _field(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        name, colon, value = text.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if not name:
            self._comments.append(value)
        elif name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
