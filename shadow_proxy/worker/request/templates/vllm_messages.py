"""Messages, tools and template arguments as vLLM 0.32 hands them to a chat
template (``template_engine: jinja2``). Pure.

vLLM validates the body with pydantic, then rebuilds every message
(``renderers/chat_utils.py``, ``_parse_chat_message_content``) before
transformers renders it; the template sees:

- only ``role``, ``content``, and per role: assistant ``tool_calls`` (when not
  null) and ``reasoning`` + ``reasoning_content`` (``reasoning_content`` on the
  way in is an alias of ``reasoning``); tool ``tool_call_id``; any role ``name``
  and ``task`` when they are strings; developer ``tools``. Every other key of
  the client's message is dropped;
- ``content`` by the template's *content format*, which vLLM detects once per
  template from its syntax tree (``detect_content_format``): ``openai`` when
  the template loops over a message's content, else ``string``. Content null
  is an empty list of parts: ``[]`` in the openai format, ``""`` in the string
  format; a string is one text part. Text parts (``text``, ``input_text``,
  ``output_text``, ``refusal``, ``thinking``) become ``{"type": "text",
  "text": ...}`` plus the part's keys vLLM does not know (openai format), or are
  joined with ``"\\n"`` (string format); a part whose text is null is skipped;
  media parts become ``{"type": "image"}`` (or audio, video) in the openai
  format and nothing in the string format (a text-only model answers 400);
- a tool message's content list (openai format) becomes its texts joined with
  ``"\\n"`` when it holds only text parts;
- a system message's text parts lose a leading ``x-anthropic-billing-header``
  line (a part of nothing else is dropped);
- assistant tool-call arguments parsed from JSON into an object (``{}`` when
  empty, not JSON or not an object); an empty ``tool_calls`` list is dropped;
- when the template never names the ``developer`` role, developer messages
  become system messages (their ``tools`` dropped) and all system messages are
  merged into one at the front, texts joined with a blank line.

Tools go to the template as vLLM's pydantic model dumps them: ``{type,
function: {name, description, parameters, strict?, defer_loading?}}``
(``description`` and ``parameters`` null when absent, unknown keys dropped),
also with ``tool_choice: "none"`` (vLLM's default keeps them).
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
import jinja2.nodes

from shadow_proxy.worker.request.fields import Reject

#: Content part types read as text, and the key that holds their text.
TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
#: Media part types and the placeholder the openai format puts in their place.
MEDIA_PARTS = {
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
    "video_embeds": "video",
}
#: Keys of content parts vLLM knows; the openai format keeps a text part's others.
KNOWN_PART_KEYS = frozenset(
    {
        "audio_embeds",
        "audio_url",
        "closed",
        "data",
        "file",
        "image_embeds",
        "image_pil",
        "image_url",
        "input_audio",
        "name",
        "prompt_cache_breakpoint",
        "refusal",
        "text",
        "thinking",
        "type",
        "uuid",
        "video_embeds",
        "video_url",
    }
)
BILLING_HEADER = "x-anthropic-billing-header"
#: Key of a chat body built from a Responses request (``vllm_responses``): its
#: messages never went through vLLM's chat validation.
FROM_RESPONSES = "_shadow_from_responses"


def _invalid() -> Reject:
    return Reject("invalid_field")


#: Part types of the Responses API. A chat message whose content holds only these
#: reaches vLLM 0.32's template without content (seen on the running server:
#: pydantic reads such a message as another type), while the same parts beside
#: a chat part (``text``, ``refusal``...), or in a Responses request, are text.
RESPONSES_ONLY_PARTS = frozenset({"input_text", "output_text"})


def conversation(
    messages: list[Any], content_format: str, *, developer_role: bool, chat: bool = True
) -> list[dict[str, Any]]:
    """The messages as the template sees them (module docstring).
    ``developer_role``: the template names the ``developer`` role; ``chat``:
    the messages came in a chat request (not built from a Responses request)."""
    result = [_message(message, content_format, chat=chat) for message in messages]
    if not developer_role and any(m["role"] == "developer" for m in result):
        result = _merge_systems(
            [
                {k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
                if m["role"] == "developer"
                else m
                for m in result
            ]
        )
    return result


def _message(message: Any, content_format: str, *, chat: bool) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise _invalid()
    role = message["role"]
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    content = message.get("content")
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
        if (
            chat
            and parts
            and all(isinstance(p, dict) and p.get("type") in RESPONSES_ONLY_PARTS for p in parts)
        ):
            parts = []
    else:
        raise _invalid()
    if role == "system":
        parts = _without_billing_header(parts)
    out: dict[str, Any] = {"role": role, "content": _content(parts, content_format)}
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            out["tool_calls"] = _tool_calls(calls)
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise _invalid()
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        text = out["content"]
        if isinstance(text, list) and all(
            isinstance(p, dict) and p.get("type") == "text" for p in text
        ):
            out["content"] = "\n".join(p.get("text", "") for p in text)
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if role == "developer":
        out["tools"] = message.get("tools")
    return out


def _content(parts: list[Any], content_format: str) -> Any:
    """The parts as one string (string format) or a list of part dicts (openai)."""
    wrap = content_format == "openai"
    items: list[Any] = []
    for part in parts:
        if isinstance(part, str):
            items.append({"type": "text", "text": part} if wrap else part)
            continue
        if not isinstance(part, dict):
            raise _invalid()
        kind = part.get("type")
        if kind in TEXT_PARTS:
            text = part.get(TEXT_PARTS[kind])
            if text is None:
                continue
            if not isinstance(text, str):
                raise _invalid()
            if wrap:
                extra = {k: v for k, v in part.items() if k not in KNOWN_PART_KEYS}
                items.append({"type": "text", "text": text, **extra})
            else:
                items.append(text)
        elif kind in MEDIA_PARTS:
            if wrap:
                extra = {k: v for k, v in part.items() if k not in KNOWN_PART_KEYS}
                items.append({"type": MEDIA_PARTS[kind], **extra})
        else:
            raise _invalid()  # vLLM: "Unsupported chat content part type" (400)
    return items if wrap else "\n".join(items)


def _without_billing_header(parts: list[Any]) -> list[Any]:
    out = []
    for part in parts:
        text = part if isinstance(part, str) else None
        if isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    """Tool calls in pydantic's key order (id, function, type, then the rest),
    arguments parsed into an object."""
    if not isinstance(calls, list):
        raise _invalid()
    out = []
    for call in calls:
        if not isinstance(call, dict):
            raise _invalid()
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise _invalid()
        ordered = {k: call[k] for k in ("id", "function", "type") if k in call}
        ordered |= {k: v for k, v in call.items() if k not in ordered}
        fn = {k: function[k] for k in ("arguments", "name") if k in function}
        fn |= {k: v for k, v in function.items() if k not in fn}
        fn["arguments"] = _arguments(function.get("arguments"))
        ordered["function"] = fn
        out.append(ordered)
    return out


def _arguments(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    if isinstance(value, dict):
        return value
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def _merge_systems(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All system messages merged into one at the front (vLLM's consolidation
    after the developer role became system); as they are when there is only one
    system message, first."""
    systems = [i for i, m in enumerate(messages) if m["role"] == "system"]
    if systems in ([], [0]):
        return messages
    texts = []
    for i in systems:
        content = messages[i].get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p if isinstance(p, str) else p["text"]
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            texts.append(content)
    rest = [m for m in messages if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


def tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """``tools`` as vLLM's ``ChatCompletionToolsParam.model_dump()`` gives them."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _invalid()
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise _invalid()
        name, description = function.get("name"), function.get("description")
        parameters = function.get("parameters")
        if not isinstance(name, str) or not isinstance(description, (str, type(None))):
            raise _invalid()
        if not isinstance(parameters, (dict, type(None))):
            raise _invalid()
        dumped: dict[str, Any] = {"name": name, "description": description}
        dumped["parameters"] = parameters
        for key in ("strict", "defer_loading"):
            value = function.get(key)
            if key == "defer_loading" and value is None:
                value = tool.get("defer_loading")
            if value is not None:
                if not isinstance(value, bool):
                    raise _invalid()
                dumped[key] = value
        out.append({"type": "function", "function": dumped})
    return out


# -- the template's content format, read from its syntax tree -----------------


def detect_content_format(template: jinja2.nodes.Template) -> str:
    """``openai`` when the template loops over a message's ``content`` (directly,
    through a variable or a macro parameter that holds it), else ``string``:
    vLLM's own test (``renderers/hf.py``, ``_detect_content_format``)."""
    names = _aliases(template, "messages")
    loops = list(template.find_all(jinja2.nodes.For))
    message_vars = {
        loop.target.name
        for loop in loops
        if isinstance(loop.target, jinja2.nodes.Name) and _reads(loop.iter, names)
    }
    for loop in loops:
        if _reads(loop.iter, message_vars, "content"):
            return "openai"
    in_macros: set[int] = set()
    for macro in template.find_all(jinja2.nodes.Macro):
        params = _content_params(template, macro, message_vars)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if isinstance(loop.iter, jinja2.nodes.Name) and loop.iter.name in params:
                return "openai"
    for loop in loops:
        if (
            id(loop) not in in_macros
            and isinstance(loop.iter, jinja2.nodes.Name)
            and loop.iter.name == "content"
        ):
            return "openai"
    return "string"


def _aliases(template: jinja2.nodes.Template, name: str) -> set[str]:
    """``name`` and every variable assigned from it (or its items, slices,
    filtered values), transitively."""
    found, queue = {name}, [name]
    while queue:
        current = queue.pop()
        for assign in template.find_all(jinja2.nodes.Assign):
            target = assign.target
            if (
                isinstance(target, jinja2.nodes.Name)
                and target.name not in found
                and _reads(assign.node, {current})
            ):
                found.add(target.name)
                queue.append(target.name)
    return found


def _reads(node: jinja2.nodes.Node, names: set[str], key: str | None = None) -> bool:
    """Whether ``node`` is one of ``names`` (or its ``key``), through filters,
    tests and slices."""
    if isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)):
        return node.node is not None and _reads(node.node, names, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _reads(node.node, names, key)
    if key is None:
        return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name in names
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            _reads(node.node, names)
            and isinstance(node.arg, jinja2.nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _reads(node.node, names) and node.attr == key
    return False


def _content_params(
    template: jinja2.nodes.Template, macro: jinja2.nodes.Macro, message_vars: set[str]
) -> set[str]:
    """The parameters of ``macro`` that some call passes a message's content."""
    params = [arg.name for arg in macro.args]
    found = set()
    for call in template.find_all(jinja2.nodes.Call):
        if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
            continue
        for i, arg in enumerate(call.args):
            if i < len(params) and _reads(arg, message_vars, "content"):
                found.add(params[i])
        for kwarg in call.kwargs:
            if kwarg.key in params and _reads(kwarg.value, message_vars, "content"):
                found.add(kwarg.key)
    return found
