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
from typing import Any

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.chat_object import read_object
from shadow_proxy.worker.response.choices import ChoiceTable
from shadow_proxy.worker.response.fast_chunk import Chunk, read_batch, read_chunk
from shadow_proxy.worker.response.outcome import MAX_ERROR_CHARS, clip, error_message, event_error
from shadow_proxy.worker.response.responses_events import ResponsesReader
from shadow_proxy.worker.response.sse import SSEEvent, WholeEvents


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

    def batch(self, chunks: list[Chunk], whole: WholeEvents, offsets: list[int]) -> None:
        """The events ``whole`` (``SSEParser.whole_array``), decoded as ``chunks``
        (``fast_chunk.decode_batch``), the i-th ``offsets[i]`` after arrival,
        read as ``data`` of each value would: in one pass up to the first the
        general parser must read, then one by one."""
        read, upstream_id, carried_at, malformed = read_batch(chunks, self.route, self.choices)
        if self.upstream_id is None:
            self.upstream_id = upstream_id
        self.malformed += malformed
        if carried_at:
            if self.chunk_timing:
                for at in carried_at:
                    self.content_at(offsets[at])
            else:
                if self.first is None:
                    self.first = offsets[carried_at[0]]
                self.last = offsets[carried_at[-1]]
        if read < whole.count:
            values = whole.values()
            for value, offset in zip(values[read:], offsets[read:], strict=True):
                self.data(value, offset)

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
