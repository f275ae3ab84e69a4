"""Chat templates rendered as vLLM 0.32 renders them: ``template_engine:
jinja2``, the vLLM profile. Pure.

The environment is transformers' ``apply_chat_template`` sandbox: trim and
lstrip blocks, loop controls, ``{% generation %}`` blocks, a ``tojson`` with
``json.dumps``' options and no HTML escaping, ``raise_exception`` and
``strftime_now``. What the template is given is vLLM's: its messages and tools
(``vllm_messages``: content by the template's content format, the keys vLLM
keeps, tool-call arguments as objects), its template arguments
(``Jinja2Template.template_kwargs``) and transformers' ``continue_final_message``.
SGLang also renders with transformers, but normalises messages its own way: this
profile is measured against vLLM only.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox

from shadow_proxy.worker.request.fields import Reject, mapping
from shadow_proxy.worker.request.templates import vllm_messages


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers marks
    assistant spans with it; the prompt text is the same)."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a set on the instance)

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


#: Names ``apply_chat_template`` takes itself (transformers' signature): vLLM lets
#: them through ``chat_template_kwargs`` whatever the template reads.
_APPLY_ARGUMENTS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
#: Of those, the ones the template never sees (``apply_chat_template`` keeps them).
_CONSUMED = _APPLY_ARGUMENTS - {"conversation", "tools"}
#: Appended to the final message for ``continue_final_message`` (transformers' tag).
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class Jinja2Template:
    """One model's chat template rendered as vLLM 0.32 renders it: its messages,
    tools and arguments (``vllm_messages``), transformers' sandbox."""

    engine = "jinja2"

    def __init__(self, source: str, special_tokens: dict[str, Any]) -> None:
        env = template_environment()
        self.source = source
        self.template = env.from_string(source)
        self.special_tokens = dict(special_tokens)
        tree = env.parse(source)
        #: The variables the template reads (vLLM passes only these kwargs on).
        self.variables = frozenset(jinja2.meta.find_undeclared_variables(tree))
        self.content_format = vllm_messages.detect_content_format(tree)
        self.developer_role = '"developer"' in source or "'developer'" in source

    def render(self, request: dict) -> str:
        """The prompt text of a chat request; raises ``jinja2.TemplateError`` (or
        a ``TypeError``/``ValueError``) where vLLM answers 400."""
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Reject("missing_messages")
        conversation = vllm_messages.conversation(
            messages,
            self.content_format,
            developer_role=self.developer_role,
            chat=not request.get(vllm_messages.FROM_RESPONSES),
        )
        tools = vllm_messages.tool_dicts(request.get("tools"))
        kwargs = self.template_kwargs(request)
        if kwargs.keys() & {"conversation", "tools", "messages"}:
            msg = "an argument given twice"  # vLLM: TypeError in render, a 400
            raise TypeError(msg)
        documents = kwargs.get("documents")
        add_generation_prompt = bool(kwargs.get("add_generation_prompt", False))
        final = kwargs.get("continue_final_message", False)
        rendered_kwargs = {k: v for k, v in kwargs.items() if k not in _CONSUMED}
        if final:
            if add_generation_prompt:
                msg = "continue_final_message and add_generation_prompt are not compatible"
                raise ValueError(msg)
            return self._continued(conversation, final, tools, documents, rendered_kwargs)
        return self.template.render(
            {
                **self.special_tokens,
                **rendered_kwargs,
                "messages": conversation,
                "tools": tools,
                "documents": documents,
                "add_generation_prompt": add_generation_prompt,
            }
        )

    def template_kwargs(self, request: dict) -> dict[str, Any]:
        """The template's arguments: ``chat_template_kwargs``, overridden by the
        request's ``add_generation_prompt``, ``continue_final_message``,
        ``documents`` and ``reasoning_effort`` (with ``enable_thinking`` unless
        the kwargs set it), kept only where the template reads them or
        ``apply_chat_template`` takes them."""
        user = mapping(request, "chat_template_kwargs") or {}
        effort = request.get("reasoning_effort")
        extra: dict[str, Any] = {
            "add_generation_prompt": request.get("add_generation_prompt", True),
            "continue_final_message": request.get("continue_final_message", False),
            "documents": request.get("documents"),
            "reasoning_effort": effort,
        }
        if effort is not None and "enable_thinking" not in user:
            extra["enable_thinking"] = effort != "none"
        merged = {**user, **{k: v for k, v in extra.items() if v is not None and v != "auto"}}
        accepted = (self.variables | _APPLY_ARGUMENTS) - {"chat_template", "tokenize"}
        return {k: v for k, v in merged.items() if k in accepted}

    def _continued(
        self,
        conversation: list[dict],
        final: Any,
        tools: Any,
        documents: Any,
        kwargs: dict[str, Any],
    ) -> str:
        """transformers' ``continue_final_message``: render with a tag after the
        final message's text, cut the prompt there."""
        key = final if isinstance(final, str) else "content"
        last = dict(conversation[-1])
        text = last.get(key)
        if text is None or key not in self.source:
            msg = f"continue_final_message: the final message has no {key!r} to continue"
            raise ValueError(msg)
        if isinstance(text, (list, tuple)):
            parts = [dict(p) for p in text]
            for part in reversed(parts):
                if "text" in part:
                    text, part["text"] = part["text"], part["text"] + CONTINUE_TAG
                    break
            else:
                msg = "continue_final_message: no text to continue in the final message"
                raise ValueError(msg)
            last[key] = parts
        else:
            last[key] = text + CONTINUE_TAG
        rendered = self.template.render(
            {
                **self.special_tokens,
                **kwargs,
                "messages": [*conversation[:-1], last],
                "tools": tools,
                "documents": documents,
                "add_generation_prompt": False,
            }
        )
        tag = CONTINUE_TAG.strip()
        if text.strip() not in rendered or tag not in rendered:
            msg = "continue_final_message: the final message is not in the rendered prompt"
            raise ValueError(msg)
        at = rendered.rindex(tag)
        if rendered[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG:
            return rendered[:at]
        return rendered[:at].rstrip()
