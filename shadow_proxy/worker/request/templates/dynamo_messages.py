"""Messages and tools as Dynamo 1.6.1 hands them to a chat template. Pure.

Dynamo reads ``messages`` and ``tools`` into typed OpenAI structs and writes
them back as JSON before rendering, so the template sees the struct's view:

- keys in the struct's order, ``role`` first, unknown keys dropped:
  user/system/developer ``{role, content, name?}``; assistant ``{role,
  content?, reasoning_content?, refusal?, name?, tool_calls?, function_call?}``
  (``reasoning`` is an alias of ``reasoning_content``; ``content: null``
  leaves the key out); tool ``{role, content, tool_call_id}`` (``name``
  dropped); function ``{role, content, name}``;
- tool calls ``{id, type, function: {name, arguments}}``;
- tools ``{type, function: {name, description?, parameters?, strict?}}``,
  then ``parameters`` missing ``type``/``properties`` get ``"type":
  "object"``/``"properties": {}`` appended, and a missing ``description``
  becomes ``""`` appended at the end of ``function``.

Requests the frontend rejects with 400 raise ``Reject("invalid_field")``:
content null or of the wrong shape where it is required, an unknown content
part, ``tools: []``, tool-call arguments that are not a JSON object string.

The per-template steps (content arrays, argument parsing, reasoning, system
normalisation) are ``fix_content``, ``parse_arguments``, ``fold_reasoning`` and
``normalize_system``; ``dynamo.py`` applies those its probes call for.
"""

from __future__ import annotations

import json
from typing import Any

from shadow_proxy.worker.request.fields import Reject

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: Content part types the frontend accepts (any other is a 400).
_PART_TYPES = frozenset(
    {"text", "image_url", "video_url", "audio_url", "input_audio", "refusal", "file"}
)
#: Media parts the template sees as placeholders (``{"type": "image"}``...).
MEDIA_PLACEHOLDERS = {"image_url": "image", "video_url": "video", "audio_url": "audio"}
#: Appended to the final message for ``continue_final_message`` (transformers' tag).
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _invalid() -> Reject:
    return Reject("invalid_field")


def _content(value: Any, *, required: bool) -> Any:
    """A message's content: a string, or a list of typed parts (each part keeps
    only its struct keys)."""
    if value is None:
        if required:
            raise _invalid()
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _invalid()
    parts = []
    for part in value:
        if not isinstance(part, dict) or part.get("type") not in _PART_TYPES:
            raise _invalid()
        kind = part["type"]
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _invalid()
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            parts.append({"type": "refusal", "refusal": part.get("refusal")})
        else:
            media = part.get(kind)
            if not isinstance(media, dict):
                raise _invalid()
            parts.append({"type": kind, kind: media})
    return parts


def _optional_str(message: dict, key: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise _invalid()
    return value


def _tool_call(call: Any) -> dict:
    if not isinstance(call, dict):
        raise _invalid()
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _invalid()
    arguments = function.get("arguments")
    if not isinstance(arguments, (str, dict)):
        raise _invalid()
    if isinstance(arguments, str) and arguments:
        try:
            parsed = json.loads(arguments)
        except ValueError:
            raise _invalid() from None
        if not isinstance(parsed, dict):
            raise _invalid()
    call_id = call.get("id")
    if not isinstance(call_id, str):
        raise _invalid()
    kind = call.get("type", "function")
    return {
        "id": call_id,
        "type": kind,
        "function": {"name": function["name"], "arguments": arguments},
    }


def struct_message(message: Any) -> dict:
    """One message as the typed struct writes it back (see the module docstring)."""
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise _invalid()
    role = message["role"]
    out: dict[str, Any] = {"role": role}
    if role == "assistant":
        content = _content(message.get("content"), required=False)
        if content is not None:
            out["content"] = content
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, (str, list)) or (
                isinstance(reasoning, list) and not all(isinstance(s, str) for s in reasoning)
            ):
                raise _invalid()
            out["reasoning_content"] = reasoning
        for key in ("refusal", "name"):
            value = _optional_str(message, key)
            if value is not None:
                out[key] = value
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise _invalid()
            out["tool_calls"] = [_tool_call(call) for call in calls]
        legacy = message.get("function_call")
        if legacy is not None:
            if not isinstance(legacy, dict) or not isinstance(legacy.get("name"), str):
                raise _invalid()
            out["function_call"] = {"name": legacy["name"], "arguments": legacy.get("arguments")}
    elif role == "tool":
        out["content"] = _content(message.get("content"), required=True)
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise _invalid()
        out["tool_call_id"] = call_id
    elif role == "function":
        out["content"] = _optional_str(message, "content")
        name = message.get("name")
        if not isinstance(name, str):
            raise _invalid()
        out["name"] = name
    else:
        out["content"] = _content(message.get("content"), required=True)
        name = _optional_str(message, "name")
        if name is not None:
            out["name"] = name
    return out


def struct_tools(tools: Any) -> list[dict] | None:
    """``tools`` as Dynamo normalises them, or None when absent."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not tools:
        raise _invalid()  # "tools array cannot be empty"
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise _invalid()
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _invalid()
        entry: dict[str, Any] = {"name": function["name"]}
        description = _optional_str(function, "description")
        if description is not None:
            entry["description"] = description
        parameters = function.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise _invalid()
            parameters = dict(parameters)
            parameters.setdefault("type", "object")
            parameters.setdefault("properties", {})
            entry["parameters"] = parameters
        if function.get("strict") is not None:
            if not isinstance(function["strict"], bool):
                raise _invalid()
            entry["strict"] = function["strict"]
        entry.setdefault("description", "")
        out.append({"type": tool.get("type", "function"), "function": entry})
    return out


# --- per-template steps ----------------------------------------------------------


def fix_content(messages: list[dict], *, arrays: bool, placeholder: str | None) -> None:
    """Content as the chosen template can take it: media parts become placeholders;
    a non-empty text-only array becomes one string joined with newlines (unless
    the template requires arrays, which turns strings into one text part); with a
    family ``placeholder`` a mixed array is flattened into text."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and arrays:
            message["content"] = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = [
                {"type": MEDIA_PLACEHOLDERS[p["type"]]} if p["type"] in MEDIA_PLACEHOLDERS else p
                for p in content
            ]
            text_only = bool(parts) and all(p["type"] == "text" for p in parts)
            if text_only and not arrays:
                message["content"] = "\n".join(p["text"] for p in parts)
            elif not arrays and parts and placeholder is not None:
                message["content"] = _flatten(parts, placeholder)
            else:
                message["content"] = parts


def _flatten(parts: list[dict], placeholder: str) -> str:
    out, n = [], 1
    for part in parts:
        if part["type"] == "text":
            out.append(part.get("text") or "")
        elif part["type"]:
            out.append(placeholder.replace("{n}", str(n)))
            n += 1
    return "".join(out)


def parse_arguments(messages: list[dict], *, tool_calls: bool) -> None:
    """JSON-string arguments parsed into objects: legacy ``function_call`` always,
    ``tool_calls`` unless the template prints the string itself."""
    for message in messages:
        calls = message.get("tool_calls") if tool_calls else None
        targets = [call["function"] for call in calls or ()]
        if isinstance(message.get("function_call"), dict):
            targets.append(message["function_call"])
        for function in targets:
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments)
                except ValueError:
                    pass


def fold_reasoning(messages: list[dict], *, template_reads_it: bool, string_only: bool) -> None:
    """Assistant reasoning for the template: moved into ``content`` as
    ``<think>...</think>`` blocks when the template does not read
    ``reasoning_content``; joined into one string when it reads only strings."""
    for message in messages:
        if message["role"] != "assistant" or "reasoning_content" not in message:
            continue
        reasoning = message["reasoning_content"]
        if template_reads_it:
            if string_only and isinstance(reasoning, list):
                message["reasoning_content"] = "".join(reasoning)
            continue
        segments = [reasoning] if isinstance(reasoning, str) else reasoning
        think = "".join(f"<think>{s}</think>" for s in segments if s)
        if not think:
            continue
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = [{"type": "text", "text": think}, *content]
        elif isinstance(content, str) and content:
            message["content"] = think + content
        else:
            message["content"] = think
        del message["reasoning_content"]
        _move_to_struct_position(message)


def _move_to_struct_position(message: dict) -> None:
    """Keep ``content`` second (after ``role``) when it was added."""
    if list(message)[1:2] != ["content"]:
        content = message.pop("content")
        rest = {k: message.pop(k) for k in list(message) if k != "role"}
        message.update({"content": content, **rest})


def normalize_system(messages: list[dict], *, demote: bool, coalesce: bool) -> list[dict]:
    """For templates that reject these shapes: a system message after the first
    becomes a user message, and consecutive user messages are joined with a
    blank line (a newline when one of them is a parts array)."""
    if not demote and not coalesce:
        return messages
    out: list[dict] = []
    for i, message in enumerate(messages):
        if demote and i > 0 and message["role"] == "system":
            message = {"role": "user", "content": message.get("content")}
        previous = out[-1] if out else None
        merge = (
            previous is not None
            and message["role"] == "user"
            and previous["role"] == "user"
            and (coalesce or (demote and messages[i]["role"] == "system"))
        )
        if merge and previous is not None:
            a, b = previous.get("content"), message.get("content")
            if isinstance(a, str) and isinstance(b, str):
                previous["content"] = f"{a}\n\n{b}"
            else:
                text = "\n".join(_text_of(c) for c in (a, b))
                previous["content"] = text
            continue
        out.append(message)
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""


def mark_final_message(messages: list[dict]) -> None:
    """``continue_final_message``: the tag after the final message's text."""
    final = messages[-1]
    content = final.get("content")
    if isinstance(content, list):
        texts = [p for p in content if p.get("type") == "text"]
        if texts:
            texts[-1]["text"] = texts[-1]["text"] + CONTINUE_TAG
            return
        content.append({"type": "text", "text": CONTINUE_TAG})
        return
    final["content"] = (content or "") + CONTINUE_TAG
    _move_to_struct_position(final)


def cut_at_tag(text: str) -> str:
    """The rendered prompt cut where the final message's text ends."""
    at = text.rfind(CONTINUE_TAG)
    return text if at < 0 else text[:at]
