"""A model's chat template rendered as Dynamo 1.6.1's frontend renders it. Pure.

Built once per model at worker start-up (``DynamoTemplate.from_sources``):
the template sources are registered as Dynamo registers them (a string is
both ``default`` and ``tool_use``; the list form registers each map key as a
template name, so Hugging Face's ``[{"name": ..., "template": ...}]`` form
registers ``name`` and ``template`` and every chat request fails, as in
Dynamo), compiled in ``minijinja_env.dynamo_environment``, and probed with
sentinel messages, as Dynamo probes them, to decide per template:

- whether it only works with content arrays (strings become text parts);
- an image placeholder for string-content families (Phi-3-vision, LLaVA-1.5,
  pass-through templates);
- whether it reads ``reasoning_content`` (else reasoning moves into content
  as ``<think>`` blocks), and whether it reads only strings there;
- whether it prints string tool-call arguments itself (``arguments is
  string`` in the source and a probe render echoes them);
- whether it rejects a non-leading system message or consecutive user
  messages (then those are rewritten).

``render(request)`` then does what Dynamo's preprocessor does per request:
normalise messages and tools (``dynamo_messages``), drop tools for
``tool_choice: "none"``, pick ``tool_use`` iff tools remain, fold ``thinking``
and ``reasoning_effort`` into the template arguments, merge
``chat_template_kwargs`` (alias ``chat_template_args``) under the built-in
names (``messages``, ``tools``, the special tokens and
``add_generation_prompt`` win), add the generation prompt unless the body says
``add_generation_prompt: false`` or ``continue_final_message: true``, and cut
the text at the final message for the latter. A render error raises
``minijinja.TemplateError`` (the frontend answers 400).

Not rebuilt (the frontend uses native, non-Jinja formatters or patches for
them): DeepSeek-V3.2/V4 and Kimi-K3 model types, Gemma-4 tool templates and
MiniMax-M2 thinking templates; the loader warns for the first group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from shadow_proxy.worker.request.fields import Reject
from shadow_proxy.worker.request.templates import dynamo_messages as dm
from shadow_proxy.worker.request.templates.minijinja_env import (
    NATIVE_STRINGS,
    dynamo_environment,
    escapes,
    native_messages,
    to_template_value,
)

_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe",
            "description": "",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
_PROBE_ARGUMENTS = '{"probe": "value"}'
_REASONING_FIRST = "\x01dynamo_reasoning_probe_first\x01"
_REASONING_LAST = "\x01dynamo_reasoning_probe_last\x01"
_PASSTHROUGH = "\x01dynamo_passthrough_probe\x01"
_THINKING_KEYS = ("thinking", "enable_thinking", "thinking_mode")


@attrs.frozen
class TemplateTraits:
    """What the load-time probes found out about one named template."""

    reads_reasoning: bool = False
    reasoning_string_only: bool = False
    prints_string_arguments: bool = False
    demote_system: bool = False
    coalesce_users: bool = False


class DynamoTemplate:
    """One model's chat templates, rendered as Dynamo 1.6.1 renders them."""

    engine = "minijinja"

    def __init__(
        self, templates: Mapping[str, str], special_tokens: Mapping[str, str | None]
    ) -> None:
        self.names = tuple(templates)
        self.sources = dict(templates)
        self.env = dynamo_environment(dict(templates))
        #: Short strings go to the templates as ``ShortStr`` unless one escapes.
        self.short = not any(escapes(source) for source in self.sources.values())
        self.special_tokens = {
            key: special_tokens.get(key) for key in ("bos_token", "eos_token", "unk_token")
        }
        self.requires_arrays = self._requires_arrays()
        self.placeholder = None if self.requires_arrays else self._image_placeholder()
        self.traits = {name: self._traits(name) for name in ("default", "tool_use")}

    @classmethod
    def from_sources(
        cls, chat_template: str | list, special_tokens: Mapping[str, str | None]
    ) -> DynamoTemplate:
        """From a ``chat_template`` value (string, or Dynamo's list of maps)."""
        if isinstance(chat_template, str):
            return cls({"default": chat_template, "tool_use": chat_template}, special_tokens)
        templates: dict[str, str] = {}
        for entry in chat_template:
            if isinstance(entry, dict):
                templates.update({k: v for k, v in entry.items() if isinstance(v, str)})
        if not templates:
            msg = "the chat_template list names no template"
            raise ValueError(msg)
        return cls(templates, special_tokens)

    # -- probes (load time) ----------------------------------------------------

    def _probe(self, name: str, messages: list, **extra: Any) -> str | None:
        """The render of ``name`` with probe messages, or None if it raises."""
        if name not in self.sources:
            return None
        context = {"messages": to_template_value(messages), "add_generation_prompt": False}
        context.update(extra)
        try:
            return self.env.render_template(name, **context)
        except Exception:  # a TemplateError, or a Python method of the value failing
            return None

    def _requires_arrays(self) -> bool:
        parts = [{"role": "user", "content": [{"type": "text", "text": "template_test"}]}]
        as_array = self._probe("default", parts) or ""
        as_string = self._probe("default", [{"role": "user", "content": "template_test"}]) or ""
        return "template_test" in as_array and "template_test" not in as_string

    def _image_placeholder(self) -> str | None:
        source = self.sources.get("default", "")
        if "<|end|>" in source and "<|assistant|>" in source:
            return "<|image_{n}|>"
        if "USER:" in source and "ASSISTANT:" in source:
            return "<image>"
        plain = self._probe("default", [{"role": "user", "content": _PASSTHROUGH}]) or ""
        if plain.strip() != _PASSTHROUGH:
            return None
        mixed = [{"type": "text", "text": _PASSTHROUGH}, {"type": "image"}]
        out = self._probe("default", [{"role": "user", "content": mixed}]) or ""
        return "" if "[" in out and "type" in out else None

    def _traits(self, name: str) -> TemplateTraits:
        if name not in self.sources:
            return TemplateTraits()
        source = self.sources[name]
        tools = to_template_value(_PROBE_TOOLS) if name == "tool_use" else None
        context = {"tools": tools, "add_generation_prompt": True, **self.special_tokens}
        strings = "arguments is string" in source and _PROBE_ARGUMENTS in (
            self._probe(name, _tool_turn(_PROBE_ARGUMENTS), **context) or ""
        )
        reads_reasoning = "reasoning_content" in source
        string_only = False
        if reads_reasoning:
            arguments = "{}" if strings else {}
            first = self._probe(name, _tool_turn(arguments, _REASONING_FIRST), **context) or ""
            if _REASONING_FIRST in first:
                both = [_REASONING_FIRST, _REASONING_LAST]
                out = self._probe(name, _tool_turn(arguments, both), **context) or ""
                string_only = _REASONING_FIRST not in out and _REASONING_LAST not in out
        context["add_generation_prompt"] = False
        demote = coalesce = False
        if self._probe(name, [_msg("system", "s"), _msg("user", "u")], **context) is not None:
            demote = any(
                self._probe(name, shape, **context) is None
                for shape in (
                    [_msg("system", "s0"), _msg("user", "u"), _msg("system", "s1")],
                    [
                        _msg("system", "s0"),
                        _msg("user", "u"),
                        _msg("assistant", "a"),
                        _msg("system", "s1"),
                        _msg("user", "u2"),
                    ],
                )
            )
            shape = [_msg("system", "s"), _msg("user", "u0"), _msg("user", "u1")]
            coalesce = self._probe(name, shape, **context) is None
        return TemplateTraits(reads_reasoning, string_only, strings, demote, coalesce)

    # -- per request -------------------------------------------------------------

    def render(self, request: dict) -> str:
        """The prompt text of a chat request (see the module docstring)."""
        raw = request.get("messages")
        if not isinstance(raw, list) or not raw:
            raise Reject("missing_messages")
        messages = [dm.struct_message(message) for message in raw]
        tools = dm.struct_tools(request.get("tools"))
        if request.get("tool_choice") == "none":
            tools = None  # Dynamo's default: exclude tools when tool_choice is none
        name = "tool_use" if tools else "default"
        traits = self.traits[name]
        messages = dm.normalize_system(
            messages, demote=traits.demote_system, coalesce=traits.coalesce_users
        )
        continue_final = request.get("continue_final_message") is True
        if continue_final:
            dm.mark_final_message(messages)
        dm.fix_content(messages, arrays=self.requires_arrays, placeholder=self.placeholder)
        dm.parse_arguments(messages, tool_calls=not traits.prints_string_arguments)
        dm.fold_reasoning(
            messages,
            template_reads_it=traits.reads_reasoning,
            string_only=traits.reasoning_string_only,
        )
        generation = request.get("add_generation_prompt") is not False and not continue_final
        native = native_messages(messages, name) if name in self.sources else None
        context: dict[str, Any] = {
            "messages": None if native else to_template_value(messages, self.short),
            "tools": to_template_value(tools, self.short),
            **self.special_tokens,
            "add_generation_prompt": generation,
        }
        for key, value in template_kwargs(request).items():
            context.setdefault(key, to_template_value(value, self.short))
        if native is None:
            text = self.env.render_template(name, **context)
        else:
            source, context[NATIVE_STRINGS] = native
            text = self.env.render_str(source, **context)
        return dm.cut_at_tag(text) if continue_final else text


def _msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def _tool_turn(arguments: Any, reasoning: Any = None) -> list[dict]:
    assistant: dict[str, Any] = {"role": "assistant", "content": ""}
    if reasoning is not None:
        assistant["reasoning_content"] = reasoning
    assistant["tool_calls"] = [
        {
            "id": "call_probe",
            "type": "function",
            "function": {"name": "probe", "arguments": arguments},
        }
    ]
    return [
        {"role": "user", "content": "u"},
        assistant,
        {"role": "tool", "tool_call_id": "call_probe", "content": "r"},
    ]


def template_kwargs(request: dict) -> dict[str, Any]:
    """``chat_template_kwargs`` (alias ``chat_template_args``; both is a 400) with
    Dynamo 1.6.1's thinking aliases folded in, as measured on the frontend:

    - body ``thinking: {"type": "enabled"|"disabled"}`` sets ``thinking``,
      ``enable_thinking`` and ``thinking_mode`` (it wins over the kwargs);
    - else ``reasoning_effort`` sets the three to enabled (disabled for
      ``"none"``) and passes ``reasoning_effort``;
    - else a boolean ``enable_thinking`` or ``thinking``, or a
      ``thinking_mode`` of enabled/disabled, in the kwargs sets the other two.
    """
    if "chat_template_kwargs" in request and "chat_template_args" in request:
        raise Reject("invalid_field")
    kwargs = request.get("chat_template_kwargs", request.get("chat_template_args"))
    if kwargs is not None and not isinstance(kwargs, dict):
        raise Reject("invalid_field")
    kwargs = dict(kwargs or {})
    mode: bool | None = None
    thinking = request.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise Reject("invalid_field")
        if kind == "adaptive":
            kwargs["thinking_mode"] = "adaptive"
        else:
            mode = kind == "enabled"
    effort = request.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise Reject("invalid_field")
        kwargs["reasoning_effort"] = effort
        if mode is None and thinking is None:
            mode = effort != "none"
    if mode is None and thinking is None:
        for key in ("enable_thinking", "thinking"):
            if isinstance(kwargs.get(key), bool):
                mode = kwargs[key]
                break
        else:
            if kwargs.get("thinking_mode") in ("enabled", "disabled"):
                mode = kwargs["thinking_mode"] == "enabled"
    if mode is not None:
        kwargs["thinking"] = kwargs["enable_thinking"] = mode
        kwargs["thinking_mode"] = "enabled" if mode else "disabled"
    return kwargs
