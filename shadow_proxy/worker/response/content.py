"""What one response's events or body say, response-wide and per choice.

Pure; the recorder (``recorder.py``) owns one per response and hands it each
dispatched SSE event, each whole one-line ``data`` event's bytes (the fast path
of ``SSEParser.whole_data``), or the unary body at the end. Per choice, the
objects are read into the ``ChoiceTable`` (``fast_chunk.py`` for the chunk
shapes of Dynamo and vLLM, ``chat_object.py`` for anything else, and
``responses_events.py`` for ``/v1/responses``); per response it keeps the first
``id``, the last ``usage``, the first error, ``[DONE]``, the malformed events,
and when output arrived (first, last, and each chunk's offset with
``chunk_timing``, at most ``max_chunk_offsets``).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from typing import Any

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.chat_object import read_object
from shadow_proxy.worker.response.choices import Choice, ChoiceTable
from shadow_proxy.worker.response.event_template import EventTemplate, TemplateRead
from shadow_proxy.worker.response.fast_chunk import Chunk, decode_batch, read_batch, read_chunk
from shadow_proxy.worker.response.outcome import MAX_ERROR_CHARS, clip, error_message, event_error
from shadow_proxy.worker.response.responses_events import ResponsesReader
from shadow_proxy.worker.response.sse import Arrivals, SSEEvent, WholeEvents

#: How many of the structs' last chunks of a batch a template is learned from.
_LEARN_FROM_LAST = 3
#: Events the structs read at a time while the stream has no template (a short
#: answer is read in one decode, a long one learns its template early).
_LEARN_AHEAD = 16


class BodyContent:
    """The content of one response as its events or body are read."""

    __slots__ = (
        "choices",
        "chunk_timing",
        "done",
        "dropped_offsets",
        "error",
        "first",
        "last",
        "malformed",
        "max_offsets",
        "offsets",
        "responses",
        "route",
        "template",
        "template_choice",
        "upstream_id",
        "usage",
    )

    def __init__(
        self, route: Route, choices: ChoiceTable, *, chunk_timing: bool, max_chunk_offsets: int
    ) -> None:
        self.route = route
        self.choices = choices
        self.chunk_timing = chunk_timing
        self.max_offsets = max_chunk_offsets
        self.upstream_id: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.first: int | None = None
        self.last: int | None = None
        self.offsets: array[int] = array("q")
        self.dropped_offsets = 0
        self.malformed = 0
        self.done = False
        #: ``/v1/responses``: typed events and the response object have their own reader.
        self.responses = ResponsesReader(choices) if route is Route.RESPONSES else None
        #: The stream's repeated event (``event_template.py``) and the choice it feeds.
        self.template: EventTemplate | None = None
        self.template_choice: Choice | None = None

    def event(self, event: SSEEvent, offset_ns: int) -> None:
        """A dispatched SSE event, ``offset_ns`` after arrival."""
        if event.event == "error":
            self.set_error(event_error(event.data, event.comments))
            return
        if self.responses is not None:
            if self.responses.event(event.event, event.data):
                self.content_at(offset_ns)
            return
        if event.event != "message":
            return  # annotations and other named events carry no output
        self.data(event.data, offset_ns)

    def data(self, data: bytes | str, offset_ns: int) -> None:
        """A ``message`` event's data, as bytes (``SSEParser.whole_data``) or as
        the text ``SSEParser.feed`` gives; not for ``/v1/responses``. The fast
        path (``fast_chunk.py``) when it can read the chunk, else the general one
        (on the text: invalid UTF-8 as U+FFFD)."""
        if data == b"[DONE]" or data == "[DONE]":
            self.done = True
            return
        read = read_chunk(data, self.route, self.choices)
        if read is None:
            text = data if isinstance(data, str) else data.decode("utf-8", "replace")
            self.json_data(text, offset_ns)
            return
        upstream_id, carried, malformed = read
        if self.upstream_id is None:
            self.upstream_id = upstream_id
        self.malformed += malformed
        if carried:
            self.content_at(offset_ns)

    def whole(self, whole: WholeEvents, offsets: list[int]) -> bool:
        """The events ``whole`` (``SSEParser.whole_events``) of a message whose
        i-th chunk came ``offsets[i]`` after arrival, read as ``data`` of each
        value would, in order: runs of events that fit the stream's template from
        their bytes (``event_template.py``); the others, when each is one
        ``data: `` line, decoded together into the typed structs and read in one
        pass (``fast_chunk.read_batch``, a few at a time while there is no
        template: the last plain chunk they read is the template from then on),
        and one by one where the structs do not describe them. False, and
        nothing read, when an event the template does not take first is not one
        ``data: `` line."""
        events, text, end = whole.events, whole.text, whole.end
        count = len(events)
        template = self.template
        got = None if template is None else template.read(text, events, 0, end)
        read = 0 if got is None else got.count
        if read < count and not whole.valid(read):
            return False
        if got is not None and read == count and got.carried is None and not self.chunk_timing:
            # All of them, each with text: the first and the last are enough.
            self._templated(got, 0, None)
            first = len(events[0]) + 1  # the first blank line's last byte
            self._carried([offsets[whole.chunk_at(first)], offsets[whole.chunk_at(end - 1)]])
            return True
        at = whole.arrivals(offsets)
        if got is not None:
            self._templated(got, 0, at)
        tried = 0  # the template was tried at events[tried] (and read up to ``read``)
        while read < count:
            template = self.template
            if template is not None and tried != read:
                tried = read
                start = end - sum(map(len, events[read:])) - 2 * (count - read)
                got = template.read(text, events[read:], start, end)
                if got is not None:
                    self._templated(got, read, at)
                    read += got.count
                    continue
            stop = count if template is not None else min(count, read + _LEARN_AHEAD)
            chunks = decode_batch(whole.array(read, stop))
            done = 0
            if chunks is not None:
                done, upstream_id, carried_at, malformed = read_batch(
                    chunks, self.route, self.choices
                )
                if self.upstream_id is None:
                    self.upstream_id = upstream_id
                self.malformed += malformed
                if carried_at:
                    self._carried_events(at, read, carried_at)
                self._learn(events, chunks, read, done)
                read += done
            if read < stop and (chunks is None or done < len(chunks)):
                self.data(events[read][6:], at[read])  # one the structs do not describe
                read += 1
        return True

    def _templated(self, got: TemplateRead, first: int, at: Arrivals | None) -> None:
        """The template's read of events from ``first`` (each at ``at[i]``; None:
        the caller takes their offsets): the text, the content chunks, the offsets."""
        choice = self.template_choice
        assert choice is not None
        if got.text:
            self.choices.add_utf8(choice, got.text)
        carried = range(got.count) if got.carried is None else got.carried
        choice.content_chunks += len(carried)
        if at is not None and carried:
            self._carried_events(at, first, carried)

    def _learn(self, events: list[bytes], chunks: list[Chunk], first: int, done: int) -> None:
        """The template of the last of the structs' ``done`` chunks (events from
        ``first``) that fits one (of the last few: a batch ends with a finish or
        usage chunk at most)."""
        for i in range(done - 1, max(done - _LEARN_FROM_LAST, 0) - 1, -1):
            chunk = chunks[i]
            template = EventTemplate.learn(events[first + i][6:], chunk, self.route)
            if template is not None and chunk.choices:
                choice = self.choices.choices.get(chunk.choices[0].index)
                if choice is not None:
                    self.template, self.template_choice = template, choice
                    return

    def _carried_events(self, at: Arrivals, first: int, carried: Sequence[int]) -> None:
        """``_carried`` of the events ``first + i`` for ``i`` in ``carried`` (not
        empty): without chunk timing only the first and the last count."""
        if not self.chunk_timing:
            carried = (carried[0], carried[-1])
        self._carried([at[first + i] for i in carried])

    def _carried(self, offsets: list[int]) -> None:
        """``content_at`` of each offset, in order (not empty)."""
        if self.first is None:
            self.first = offsets[0]
        self.last = offsets[-1]
        if self.chunk_timing:
            room = self.max_offsets - len(self.offsets)
            self.offsets.extend(offsets[: max(room, 0)])
            self.dropped_offsets += max(len(offsets) - max(room, 0), 0)

    def json_data(self, data: str, offset_ns: int) -> None:
        if data == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.malformed += 1
            return
        if not isinstance(obj, dict):
            self.malformed += 1
            return
        self.object(obj, offset_ns, stream=True)

    def unary(self, body: bytearray, offset_ns: int | None, status: int | None) -> None:
        """The whole body of a response that was not an event stream."""
        if not body or body.isspace():
            return
        status_error = status is not None and status >= 400
        try:
            obj = json.loads(body)
        except ValueError:
            self.malformed += 1
            if status_error:
                text = body[: MAX_ERROR_CHARS * 4].decode("utf-8", "replace").strip()
                self.set_error(clip(text))
            return
        if not isinstance(obj, dict):
            self.malformed += 1
            return
        message = error_message(obj, detail=status_error)
        if message is not None:
            self.set_error(message)
        if self.responses is None:
            self.object(obj, offset_ns, stream=False)
        elif self.responses.body(obj) and offset_ns is not None:
            self.content_at(offset_ns)

    def settle(self) -> None:
        """At the end: what the Responses reader saw, as the chat parsing would
        have set it."""
        reader = self.responses
        if reader is None:
            return
        if reader.error is not None:
            self.set_error(reader.error)
        self.upstream_id = self.upstream_id or reader.response_id
        self.usage = reader.usage or self.usage
        self.malformed += reader.malformed
        self.done = self.done or reader.done

    def set_error(self, message: str) -> None:
        if self.error is None:
            self.error = message

    def object(self, obj: dict[str, Any], offset_ns: int | None, *, stream: bool) -> None:
        """One chat or completions object: a streamed chunk or a unary body."""
        error, upstream_id, usage, carried, malformed = read_object(
            obj, self.route, self.choices, stream=stream
        )
        if error is not None:
            self.set_error(error)
        if self.upstream_id is None:
            self.upstream_id = upstream_id
        if usage is not None:
            self.usage = usage
        self.malformed += malformed
        if carried and offset_ns is not None:
            self.content_at(offset_ns)

    def content_at(self, offset_ns: int) -> None:
        """A chunk carrying output arrived ``offset_ns`` after the request."""
        if self.first is None:
            self.first = offset_ns
        self.last = offset_ns
        if self.chunk_timing:
            if len(self.offsets) < self.max_offsets:
                self.offsets.append(offset_ns)
            else:
                self.dropped_offsets += 1
