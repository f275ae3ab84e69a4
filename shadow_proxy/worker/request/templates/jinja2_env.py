"""Chat templates rendered as transformers renders them (jinja2), for frontends
that do so (vLLM, SGLang): ``template_engine: jinja2``. Pure.

The environment is transformers' ``apply_chat_template`` sandbox: trim and
lstrip blocks, loop controls, ``{% generation %}`` blocks, a ``tojson`` with
``json.dumps``' options and no HTML escaping, ``raise_exception`` and
``strftime_now``. Messages keep the client's keys (None values dropped), with
text-only content arrays joined by newlines and tool-call arguments parsed into
objects, as vLLM hands them over; reasoning is offered under its usual aliases.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from shadow_proxy.worker.request.fields import Reject, mapping

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers marks
    assistant spans with it; the prompt text is the same)."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Like transformers: no HTML escaping, json.dumps options exposed.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def template_environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """A sandbox with the settings and helpers of transformers' ``apply_chat_template``."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class Jinja2Template:
    """One model's chat template in transformers' sandbox."""

    engine = "jinja2"

    def __init__(self, source: str, special_tokens: dict[str, Any]) -> None:
        self.template = template_environment().from_string(source)
        self.special_tokens = dict(special_tokens)

    def render(self, request: dict) -> str:
        """The prompt text of a chat request; raises ``jinja2.TemplateError`` (or a
        ``TypeError``/``ValueError`` of the template) when the template fails."""
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Reject("missing_messages")
        tools = request.get("tools")
        if request.get("tool_choice") == "none":
            tools = None
        context = {
            **self.special_tokens,
            **_template_kwargs(request),
            "messages": _template_messages(messages),
            "tools": tools,
            "documents": None,
            "add_generation_prompt": True,
        }
        return self.template.render(context)


def _template_messages(messages: list[dict]) -> list[dict]:
    """Keys with None values dropped, reasoning under its usual aliases, content
    made only of text parts joined into one string with newlines, tool-call
    arguments parsed from their JSON string into an object."""
    result = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        content = message.get("content")
        if isinstance(content, list) and all(part.get("type") == "text" for part in content):
            message["content"] = "\n".join(part["text"] for part in content)
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [_parsed_arguments(call) for call in message["tool_calls"]]
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        result.append(message)
    return result


def _parsed_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str) or not arguments:
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        raise Reject("invalid_field") from None
    if not isinstance(parsed, dict):
        raise Reject("invalid_field")
    return {**call, "function": {**function, "arguments": parsed}}


def _template_kwargs(request: dict) -> dict[str, Any]:
    """``chat_template_kwargs`` (alias ``chat_template_args``) plus the folding of
    ``thinking`` and ``reasoning_effort`` into them."""
    kwargs = mapping(request, "chat_template_kwargs")
    if kwargs is None:
        kwargs = mapping(request, "chat_template_args")
    kwargs = dict(kwargs or {})
    thinking = request.get("thinking")
    if thinking is not None:
        mode = thinking if isinstance(thinking, bool) else None
        if isinstance(thinking, dict):
            mode = {"enabled": True, "disabled": False, "adaptive": "adaptive"}.get(
                thinking.get("type"), "invalid"
            )
        if mode is None or mode == "invalid":
            raise Reject("invalid_field")
        if mode == "adaptive":
            kwargs["thinking_mode"] = "adaptive"
        else:
            kwargs["thinking"] = mode
            kwargs["thinking_mode"] = "enabled" if mode else "disabled"
    effort = request.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise Reject("invalid_field")
        kwargs.setdefault("enable_thinking", effort != "none")
        kwargs["reasoning_effort"] = effort
    return kwargs
