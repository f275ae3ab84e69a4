"""What one chat or completions object says, per choice: a streamed chunk or a unary body.

Pure. ``read_object`` adds the object's output to the choice table (text, upstream
token ids, content chunks, finish reasons) and returns what the recorder keeps of
the response as a whole (``recorder.py``). What is read: chat ``delta`` (streamed)
or ``message`` (unary) ``content`` (a string or content parts),
``reasoning_content`` and ``reasoning``, ``refusal``, tool-call and legacy
``function_call`` ``name``/``arguments``; completions ``text``; ``token_ids`` on
the choice (vLLM's ``return_token_ids``); the object's ``id`` and ``usage``; an
error the stream sends in an event.
"""

from __future__ import annotations

from typing import Any

from shadow_proxy.exchange import Route
from shadow_proxy.worker.response.choices import Choice, ChoiceTable
from shadow_proxy.worker.response.outcome import error_message

#: Ids and finish reasons are kept to this many characters.
MAX_ID_CHARS = 256


def read_object(
    obj: dict[str, Any], route: Route, table: ChoiceTable, *, stream: bool
) -> tuple[str | None, str | None, dict[str, Any] | None, bool, int]:
    """Read ``obj`` into ``table``; returns the error it carries (streamed objects
    only), its ``id``, its ``usage``, whether a choice carried output, and how
    many malformed token-id lists it held."""
    error = error_message(obj) if stream else None
    rid = obj.get("id")
    upstream_id = rid[:MAX_ID_CHARS] if isinstance(rid, str) and rid else None
    usage = obj.get("usage")
    usage = usage if isinstance(usage, dict) else None
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return error, upstream_id, usage, False, 0
    carried = False
    malformed = 0
    for raw in choices:
        if not isinstance(raw, dict):
            table.ignored += 1
            continue
        choice = table.get(raw.get("index", 0))
        if choice is None:
            continue
        content = False
        if route is not Route.COMPLETIONS:
            part = raw.get("delta") if stream else raw.get("message")
            if isinstance(part, dict):
                content = _chat_part(table, choice, part)
        if route is not Route.CHAT:
            piece = raw.get("text")
            if isinstance(piece, str) and piece:
                table.add_text(choice, piece)
                content = True
        ids = raw.get("token_ids")
        if isinstance(ids, list) and ids:
            if table.add_ids(choice, ids):
                content = True
            else:
                malformed += 1
        if content:
            choice.content_chunks += 1
            carried = True
        reason = raw.get("finish_reason")
        if reason is not None:
            choice.finish_reason = str(reason)[:MAX_ID_CHARS]
    return error, upstream_id, usage, carried, malformed


def _chat_part(table: ChoiceTable, choice: Choice, part: dict[str, Any]) -> bool:
    content = False
    piece = part.get("content")
    if isinstance(piece, str) and piece:
        table.add_text(choice, piece)
        content = True
    elif isinstance(piece, list):  # content parts
        for item in piece:
            if isinstance(item, dict) and isinstance(item.get("text"), str) and item["text"]:
                table.add_text(choice, item["text"])
                content = True
    reasoning = part.get("reasoning_content")
    other = part.get("reasoning")
    refusal = part.get("refusal")
    for piece in (reasoning, other if other != reasoning else None, refusal):
        if isinstance(piece, str) and piece:
            table.add_text(choice, piece)
            content = True
    calls = part.get("tool_calls")
    functions = (
        [c.get("function") for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    )
    legacy = part.get("function_call")
    if isinstance(legacy, dict):
        functions.append(legacy)
    for function in functions:
        if not isinstance(function, dict):
            continue
        for key in ("name", "arguments"):
            piece = function.get(key)
            if isinstance(piece, str) and piece:
                table.add_text(choice, piece)
                content = True
    return content
