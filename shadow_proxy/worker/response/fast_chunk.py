"""The fast path for the stream chunks Dynamo and vLLM send: typed structs, read exactly.

Pure. ``read_chunk`` reads one ``data:`` event's bytes with msgspec into structs
shaped like the chat and completions chunks of Dynamo 1.6.1 and vLLM (``Chunk``,
``StreamChoice``, ``Delta``) and adds it to the choice table exactly as
``chat_object.read_object`` would after ``json.loads`` (same text, ids, content
chunks, finish reasons, id); msgspec reads integers of any size exactly and
stores each string as ``json.loads`` does. Anything the structs do not describe
is left to the general parser, which the caller then runs on the same bytes
(``read_chunk`` returns None and has changed nothing):

- bytes msgspec does not decode (invalid UTF-8, which the general path reads
  with U+FFFD; lone surrogates; ``NaN``; malformed JSON), a field of another type
  than the struct's (``content`` as parts, an ``index`` that is not an int, ...),
  and any field the structs do not name (``error`` among them);
- a ``usage`` that is not null (the last chunk; ``usage`` is kept as the map
  ``json.loads`` gives), ``"object": "error"``, and tool or function calls.

Fields named only to be skipped are ``msgspec.Raw`` (not decoded); ``usage``,
``tool_calls`` and ``function_call`` are decoded as they come only to see
whether they are there (a chunk with any of them goes to the general parser).

``decode_batch`` and ``read_batch`` do the same for all the chunks of one
hand-off message at once (``SSEParser.whole_array`` joins their values into one
JSON array): one decode and one pass, without a call per chunk.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.chat_object import MAX_ID_CHARS
from shadow_proxy.worker.response.choices import Choice, ChoiceTable

NULL = msgspec.Raw(b"null")


class Delta(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    role: msgspec.Raw = NULL
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: Any = None
    function_call: Any = None


class StreamChoice(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    index: int = 0
    delta: Delta | None = None
    text: str | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: msgspec.Raw = NULL
    stop_reason: msgspec.Raw = NULL
    prompt_token_ids: msgspec.Raw = NULL


class Chunk(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    id: str | None = None
    choices: list[StreamChoice] | None = None
    object: str | None = None
    usage: Any = None
    created: msgspec.Raw = NULL
    model: msgspec.Raw = NULL
    system_fingerprint: msgspec.Raw = NULL
    service_tier: msgspec.Raw = NULL
    prompt_token_ids: msgspec.Raw = NULL
    prompt_text: msgspec.Raw = NULL
    metrics: msgspec.Raw = NULL
    nvext: msgspec.Raw = NULL


_DECODER = msgspec.json.Decoder(Chunk)


def read_chunk(
    data: bytes | str, route: Route, table: ChoiceTable
) -> tuple[str | None, bool, int] | None:
    """Read one streamed chunk into ``table``: its ``id``, whether a choice carried
    output, and how many malformed token-id lists it held; None (``table``
    untouched) when the general parser must read it (module docstring)."""
    try:
        chunk = _DECODER.decode(data)
    except msgspec.DecodeError:  # ValidationError included
        return None
    read, upstream_id, carried_at, malformed = read_batch([chunk], route, table)
    if not read:
        return None
    return upstream_id, bool(carried_at), malformed


_BATCH_DECODER = msgspec.json.Decoder(list[Chunk])


def decode_batch(array: bytes) -> list[Chunk] | None:
    """The chunks of a JSON array of streamed chunks (``SSEParser.whole_array``),
    in one decode; None when any of them is not one the structs describe."""
    try:
        return _BATCH_DECODER.decode(array)
    except msgspec.DecodeError:
        return None


def read_batch(
    chunks: list[Chunk], route: Route, table: ChoiceTable
) -> tuple[int, str | None, list[int], int]:
    """Read decoded chunks into ``table`` in order, as ``read_chunk`` of each would,
    up to the first the general parser must read (a non-null ``usage``, an
    ``"object": "error"``, a tool or function call): how many were read, the
    first ``id`` among them (cut as ``read_chunk`` cuts it), the positions of
    those that carried output, and the malformed token-id lists.

    One pass without a call per chunk: consecutive text pieces of one choice are
    added to the table at once (the same bytes, cut at the same character when a
    cap is reached, as adding them one by one; pieces of another choice in
    between keep their order)."""
    chat, completions = route is not Route.COMPLETIONS, route is not Route.CHAT
    current: Choice | None = None  # the choice whose text pieces are gathered
    texts: list[str] = []
    carried_at: list[int] = []
    upstream_id: str | None = None
    malformed = 0
    read = 0
    known = table.choices
    for chunk in chunks:
        if chunk.usage is not None or chunk.object == "error":
            break
        choices = chunk.choices
        if choices:
            calls = False
            for raw in choices:
                delta = raw.delta
                if delta is not None and (
                    delta.tool_calls is not None or delta.function_call is not None
                ):
                    calls = True
            if calls:
                break
        if upstream_id is None and chunk.id:
            upstream_id = chunk.id[:MAX_ID_CHARS]
        if choices:
            carried = False
            for raw in choices:
                choice = known.get(raw.index)
                if choice is None:
                    choice = table.get(raw.index)
                    if choice is None:
                        continue
                content = False
                pieces: list[str] = []
                delta = raw.delta
                if chat and delta is not None:
                    piece = delta.content
                    if piece:
                        pieces.append(piece)
                    reasoning, other, refusal = (
                        delta.reasoning_content,
                        delta.reasoning,
                        delta.refusal,
                    )
                    if reasoning or other or refusal:
                        for piece in (reasoning, other if other != reasoning else None, refusal):
                            if piece:
                                pieces.append(piece)
                if completions:
                    piece = raw.text
                    if piece:
                        pieces.append(piece)
                if pieces:
                    if choice is not current:
                        if current is not None:
                            table.add_text(current, "".join(texts))
                        current, texts = choice, pieces
                    else:
                        texts += pieces
                    content = True
                ids = raw.token_ids
                if ids:
                    if table.add_ids(choice, ids):
                        content = True
                    else:
                        malformed += 1
                if content:
                    choice.content_chunks += 1
                    carried = True
                reason = raw.finish_reason
                if reason is not None:
                    choice.finish_reason = reason[:MAX_ID_CHARS]
            if carried:
                carried_at.append(read)
        read += 1
    if current is not None:
        table.add_text(current, "".join(texts))
    return read, upstream_id, carried_at, malformed
