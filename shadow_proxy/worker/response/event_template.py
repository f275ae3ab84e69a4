"""A stream's repeated event, read from its bytes: the events that differ only in
their text.

Pure. Dynamo and vLLM send one chunk per token, and within a stream those chunks
are the same bytes but for one JSON string: the same ``id``, ``created``,
``model``, choice index and nulls around ``"content":"..."`` (chat) or
``"text":"..."`` (completions). Once the typed structs (``fast_chunk.py``) have
read such a chunk, ``EventTemplate.learn`` keeps the bytes before and after that
string; ``EventTemplate.read`` then takes every later event made of those very
bytes around a string, without decoding the JSON around it.

Why it is exact: replacing one JSON string by another leaves a document of the
same structure, so such an event decodes to the learned chunk with only that
string changed, and the structs read it as ``fast_chunk.read_batch`` reads a
chunk whose one choice carries only that text: its text added to the choice (no
text when it is empty), one content chunk counted when it is not empty, nothing
else changed (the ``id`` is the learned chunk's, already taken). A string is
taken only when its bytes are a JSON string's body that msgspec decodes, as the
structs decode it; raw UTF-8 without escapes, quotes or control characters is
the text's own bytes. An event of any other shape stops the read: it and the
events after it go to the structs, in order.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import re

import attrs
import msgspec

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.fast_chunk import NULL, Chunk

#: A byte a JSON string's body holds only escaped (or never, for control bytes).
_SPECIAL = re.compile(rb'["\\\x00-\x1f]')
#: A JSON string's body that cannot end inside an escape or hold a bare quote
#: (msgspec then decodes it between quotes as the structs would, or refuses).
_BODY = re.compile(rb'(?:[^"\\\x00-\x1f]++|\\[^\x00-\x1f])*+')
_STRING = msgspec.json.Decoder(str)
#: The delta's text fields ``fast_chunk.read_batch`` adds to a choice's text.
_CHAT_TEXT_FIELDS = ("content", "reasoning_content", "reasoning", "refusal")


@attrs.frozen
class TemplateRead:
    """What ``EventTemplate.read`` took: the first ``count`` events, their texts
    joined as UTF-8, and which of them carried text (None: all of them)."""

    count: int
    text: bytes
    carried: list[int] | None


@attrs.frozen
class EventTemplate:
    """The bytes around the one string that changes from event to event."""

    #: ``data: `` + the event's JSON up to and including the string's opening quote.
    head: bytes
    #: From the string's closing quote to the event's end (its blank line excluded).
    tail: bytes

    @classmethod
    def learn(cls, value: bytes, chunk: Chunk, route: Route) -> EventTemplate | None:
        """The template of an event whose value is ``value``, decoded by the structs
        as ``chunk`` and read by them for ``route``; None unless the chunk's one
        choice carries nothing but one non-empty text (its index one the table
        holds is the caller's to check) whose string in ``value`` has no escape."""
        if route is Route.RESPONSES or chunk.usage is not None or chunk.object == "error":
            return None
        choices = chunk.choices
        if not choices or len(choices) != 1:
            return None
        choice = choices[0]
        if (
            choice.finish_reason is not None
            or choice.token_ids is not None
            or choice.logprobs != NULL
        ):
            return None
        if route is Route.CHAT:
            delta = choice.delta
            if delta is None or delta.tool_calls is not None or delta.function_call is not None:
                return None
            texts = [(f, getattr(delta, f)) for f in _CHAT_TEXT_FIELDS]
            texts = [(f, t) for f, t in texts if t is not None]
            if len(texts) != 1:
                return None
            field, text = texts[0]
        else:  # completions: the struct path reads ``text`` (and a delta's texts too)
            if choice.delta is not None or choice.text is None:
                return None
            field, text = "text", choice.text
        if not text:
            return None
        key = b'"' + field.encode() + b'"'
        if value.count(key) != 1 or value.count(b"\n"):
            return None
        start = value.find(key + b':"')
        if start < 0:
            return None
        start += len(key) + 1  # at the opening quote
        stop = value.find(b'"', start + 1)
        body = value[start + 1 : stop]
        if stop < 0 or _SPECIAL.search(body) or body != text.encode("utf-8"):
            return None
        return cls(b"data: " + value[: start + 1], value[stop:])

    def read(self, text: bytes, events: list[bytes], start: int, end: int) -> TemplateRead | None:
        """The leading ``events`` made of this template's bytes around a string
        msgspec decodes (they are ``text[start:end]`` split at its blank lines);
        None when the first is not. All at once when they all are (the text
        rebuilt from their strings is the text), else one by one."""
        head, tail = self.head, self.tail
        pieces = list(map(operator.itemgetter(slice(len(head), -len(tail))), events))
        if (
            end - start >= len(head) + len(tail) + 2
            and text.startswith(head, start)
            and text.endswith(tail + b"\n\n", start, end)
            and text[start + len(head) : end - len(tail) - 2]
            == (tail + b"\n\n" + head).join(pieces)
        ):
            # Then every event is head + string + tail: each string's bytes hold no
            # line end (``_pieces`` refuses control bytes), so the separators are
            # the blank lines.
            return _pieces(pieces)
        return self._each(events)

    def _each(self, events: list[bytes]) -> TemplateRead | None:
        """``read`` of the events one by one, up to the first that does not fit."""
        head, tail = self.head, self.tail
        repeat = itertools.repeat
        fits = list(
            map(
                all,
                zip(
                    map(bytes.startswith, events, repeat(head)),
                    map(bytes.endswith, events, repeat(tail)),
                    # head and tail may not overlap (both hold the string's quotes)
                    map((len(head) + len(tail)).__le__, map(len, events)),
                    strict=True,
                ),
            )
        )
        count = fits.index(False) if False in fits else len(fits)
        if not count:
            return None
        pieces = list(map(operator.itemgetter(slice(len(head), -len(tail))), events[:count]))
        return _pieces(pieces)


def _pieces(pieces: list[bytes]) -> TemplateRead | None:
    """The strings whose bodies are ``pieces``, read (all of them, or None). A body
    without a quote, a backslash or a control byte is its text's UTF-8; only
    those with one are decoded (msgspec, as the structs decode them), each
    checked first not to end inside an escape nor hold a bare quote."""
    joined = b"".join(pieces)
    try:
        joined.decode("utf-8")  # escapes are ASCII: the rest must be valid as it is
    except UnicodeDecodeError:  # the structs refuse it: they read it then
        return None
    special = [match.start() for match in _SPECIAL.finditer(joined)]
    if not special:
        text = joined
    else:
        ends = list(itertools.accumulate(map(len, pieces)))
        parts: list[bytes] = []
        at = 0
        for i in sorted({bisect.bisect_right(ends, offset) for offset in special}):
            body = pieces[i]
            if not _BODY.fullmatch(body):
                return None
            try:
                decoded = _STRING.decode(b'"' + body + b'"')
            except msgspec.DecodeError:  # a bad escape, a lone surrogate
                return None
            start = ends[i] - len(body)
            parts += (joined[at:start], decoded.encode("utf-8"))
            at = ends[i]
        parts.append(joined[at:])
        text = b"".join(parts)
    carried = None if b"" not in pieces else [i for i, p in enumerate(pieces) if p]
    return TemplateRead(len(pieces), text, carried)
