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

Fields named only to be skipped are ``msgspec.Raw`` (not decoded).
"""

from __future__ import annotations

import msgspec

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.chat_object import MAX_ID_CHARS
from shadow_proxy.worker.response.choices import ChoiceTable

NULL = msgspec.Raw(b"null")


class Delta(msgspec.Struct, forbid_unknown_fields=True):
    role: msgspec.Raw = NULL
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: msgspec.Raw = NULL
    function_call: msgspec.Raw = NULL


class StreamChoice(msgspec.Struct, forbid_unknown_fields=True):
    index: int = 0
    delta: Delta | None = None
    text: str | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: msgspec.Raw = NULL
    stop_reason: msgspec.Raw = NULL
    prompt_token_ids: msgspec.Raw = NULL


class Chunk(msgspec.Struct, forbid_unknown_fields=True):
    id: str | None = None
    choices: list[StreamChoice] | None = None
    object: str | None = None
    usage: msgspec.Raw = NULL
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
    if chunk.usage != NULL or chunk.object == "error":
        return None
    choices = chunk.choices
    if choices:
        for raw in choices:
            delta = raw.delta
            if delta is not None and (delta.tool_calls != NULL or delta.function_call != NULL):
                return None
    rid = chunk.id
    upstream_id = rid[:MAX_ID_CHARS] if rid else None
    if choices is None:
        return upstream_id, False, 0
    chat, completions = route is not Route.COMPLETIONS, route is not Route.CHAT
    carried = False
    malformed = 0
    for raw in choices:
        choice = table.get(raw.index)
        if choice is None:
            continue
        content = False
        delta = raw.delta
        if chat and delta is not None:
            piece = delta.content
            if piece:
                table.add_text(choice, piece)
                content = True
            reasoning, other = delta.reasoning_content, delta.reasoning
            for piece in (reasoning, other if other != reasoning else None, delta.refusal):
                if piece:
                    table.add_text(choice, piece)
                    content = True
        if completions:
            piece = raw.text
            if piece:
                table.add_text(choice, piece)
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
    return upstream_id, carried, malformed
