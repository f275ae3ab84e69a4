"""A Responses API request -> the chat request vLLM 0.32 renders in its place
(``template_engine: jinja2``). Pure.

vLLM's own conversion (``entrypoints/openai/responses/utils.py``,
``construct_input_messages``), unlike Dynamo's (``responses.py``):

- ``instructions`` (when not empty) opens a system message; a string ``input``
  is one user message; other system and developer items stay messages of their
  own (the template may merge developer into system: ``vllm_messages``);
- a message item is handed on as it is (its content parts are read as chat
  parts: ``input_text`` is text), except an assistant message, which keeps only
  the text of its *first* content part;
- a ``function_call`` becomes a tool call (``id`` = ``call_id``) of the
  assistant message just before it, or of a new assistant message without
  content; a ``reasoning`` item the ``reasoning`` of the assistant message
  before it when that has none (its first ``content`` text, else its first
  ``summary`` text), else a new assistant message; an assistant message after
  an assistant message without content fills that content;
- ``function_call_output`` -> a ``tool`` message; any other item is a 400;
- function tools -> chat tools (kept with ``tool_choice: "none"``);
- the final message continues (``continue_final_message``, no generation
  prompt) when it is a message or reasoning item with ``status``
  ``in_progress`` or ``incomplete``; ``reasoning.effort`` ->
  ``reasoning_effort``; ``chat_template_kwargs`` as for chat;
  ``max_output_tokens`` -> ``max_tokens``; ``temperature`` and ``top_p``.

``previous_response_id`` and a stored ``prompt`` cannot be rebuilt from the
body (``previous_response``, ``stored_prompt``), as for Dynamo.
"""

from __future__ import annotations

from typing import Any

from shadow_proxy.worker.request.fields import Reject
from shadow_proxy.worker.request.responses import STATEFUL_FIELDS
from shadow_proxy.worker.request.templates.vllm_messages import FROM_RESPONSES


def _invalid() -> Reject:
    return Reject("invalid_field")


def chat_request(request: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body vLLM 0.32 renders for a Responses body (module
    docstring). Raises ``Reject`` for what vLLM refuses or what cannot be rebuilt."""
    for key, reason in STATEFUL_FIELDS:
        if request.get(key) is not None:
            raise Reject(reason)
    items = request.get("input")
    final = _continues(items)
    chat: dict[str, Any] = {
        "model": request.get("model"),
        "messages": messages(request.get("instructions"), items),
        "add_generation_prompt": not final,
        "continue_final_message": final,
        FROM_RESPONSES: True,
    }
    tools = _tools(request.get("tools"))
    if tools:
        chat["tools"] = tools
    reasoning = request.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise _invalid()
        if reasoning.get("effort") is not None:
            chat["reasoning_effort"] = reasoning["effort"]
    if request.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = request["chat_template_kwargs"]
    if request.get("max_output_tokens") is not None:
        chat["max_tokens"] = request["max_output_tokens"]
    for key in ("temperature", "top_p"):
        if request.get(key) is not None:
            chat[key] = request[key]
    return chat


def messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """The chat messages of ``instructions`` and ``input``."""
    out: list[dict[str, Any]] = []
    if instructions:
        if not isinstance(instructions, str):
            raise _invalid()
        out.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return out
    if not isinstance(items, list):
        raise Reject("missing_messages" if items is None else "invalid_field")
    for item in items:
        message = _message(item, out[-1] if out else None)
        if message is not None:
            out.append(message)
    if not out:
        raise Reject("missing_messages")
    return out


def _message(item: Any, previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """The message of one item, or None when it went into ``previous``."""
    if not isinstance(item, dict):
        raise _invalid()
    assistant = previous if previous is not None and previous.get("role") == "assistant" else None
    kind = item.get("type")
    if kind == "function_call":
        call = _call(item)
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise _invalid()  # "Encrypted content is not supported."
        text = _first_text(item.get("content")) or _first_text(item.get("summary")) or ""
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = text
            return None
        return {"role": "assistant", "reasoning": text}
    if kind == "function_call_output":
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind in (None, "message") and item.get("role") == "assistant":
        content = item.get("content")
        said = content if isinstance(content, str) else _first_text(content)
        if said is None:
            raise _invalid()
        if assistant is not None and assistant.get("content") is None:
            assistant["content"] = said
            return None
        return {"role": "assistant", "content": said}
    if kind in (None, "message") and isinstance(item.get("role"), str):
        return dict(item)
    raise _invalid()  # "Unsupported input item type"


def _call(item: dict[str, Any]) -> dict[str, Any]:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not all(isinstance(v, str) for v in (call_id, name, arguments)):
        raise _invalid()
    return {"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}


def _first_text(parts: Any) -> str | None:
    if isinstance(parts, list) and parts and isinstance(parts[0], dict):
        text = parts[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _continues(items: Any) -> bool:
    """vLLM's ``should_continue_final_message``: the last item is a message or
    reasoning item still in progress."""
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return False
    last = items[-1]
    if last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Function tools as chat tools (other tool types do not reach the template)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _invalid()
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise _invalid()
        if tool.get("type") == "function":
            out.append(
                {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
            )
    return out
