"""Chat templates rendered as transformers renders them (``template_engine:
jinja2``): its sandbox and helpers, messages as vLLM hands them over, and the
thinking options folded into the template's keyword arguments."""

from __future__ import annotations

import jinja2
import pytest

from shadow_proxy.worker.request.fields import Reject
from shadow_proxy.worker.request.templates.jinja2_env import Jinja2Template

ECHO = "{% for m in messages %}{{ m | tojson }}\n{% endfor %}G={{ add_generation_prompt }}"


def render(source: str, request: dict, **tokens: str) -> str:
    return Jinja2Template(source, tokens).render(request)


def user(text: str = "x") -> dict:
    return {"role": "user", "content": text}


class TestEnvironment:
    """transformers' sandbox: trimmed blocks, loop controls, generation blocks,
    an unescaped ``tojson`` with json.dumps' options, its globals."""

    @pytest.mark.parametrize(
        ("source", "want"),
        [
            ("{% if true %}\n  A\n{% endif %}B", "  A\nB"),
            ("{{ {'h': '<&>', 'u': 'ü'} | tojson }}", '{"h": "<&>", "u": "ü"}'),
            (
                "{{ {'b': 1, 'a': 2} | tojson(indent=1, sort_keys=true) }}",
                '{\n "a": 2,\n "b": 1\n}',
            ),
            ("{{ 'ü' | tojson(ensure_ascii=true) }}", '"\\u00fc"'),
            ("{% generation %}G{% endgeneration %}", "G"),
            (
                "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}",
                "01",
            ),
            ("{{ bos_token }}|{{ add_generation_prompt }}|{{ documents }}", "<s>|True|None"),
        ],
    )
    def test_expression(self, source: str, want: str) -> None:
        assert render(source, {"messages": [user()]}, bos_token="<s>") == want

    def test_raise_exception(self) -> None:
        with pytest.raises(jinja2.TemplateError, match="no system"):
            render("{{ raise_exception('no system') }}", {"messages": [user()]})

    def test_strftime_now(self) -> None:
        assert len(render("{{ strftime_now('%Y') }}", {"messages": [user()]})) == 4

    def test_sandboxed(self) -> None:
        with pytest.raises(jinja2.exceptions.SecurityError):
            render("{{ messages.append(1) }}", {"messages": [user()]})


class TestMessages:
    """Messages keep the client's keys, None values dropped, text arrays joined,
    arguments parsed, reasoning under its aliases."""

    def test_keys_kept_and_none_dropped(self) -> None:
        message = {"role": "user", "content": "c", "name": None, "extra": 1}
        assert render(ECHO, {"messages": [message]}).split("\n")[0] == (
            '{"role": "user", "content": "c", "extra": 1}'
        )

    def test_text_arrays_joined_mixed_arrays_kept(self) -> None:
        text = {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
        mixed = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}
        lines = render(ECHO, {"messages": [text, mixed]}).split("\n")
        assert lines[0] == '{"role": "user", "content": "a\\nb"}'
        assert lines[1] == (
            '{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}'
        )

    def test_arguments_parsed(self) -> None:
        call = {"id": "c", "function": {"name": "f", "arguments": '{"a": 1}'}}
        turn = {"role": "assistant", "tool_calls": [call]}
        source = "{{ messages[1].tool_calls[0].function.arguments.a }}"
        assert render(source, {"messages": [user(), turn]}) == "1"

    @pytest.mark.parametrize("arguments", ["[1]", "{bad"])
    def test_bad_arguments_rejected(self, arguments: str) -> None:
        call = {"id": "c", "function": {"name": "f", "arguments": arguments}}
        with pytest.raises(Reject, match="invalid_field"):
            render(ECHO, {"messages": [user(), {"role": "assistant", "tool_calls": [call]}]})

    def test_reasoning_under_its_aliases(self) -> None:
        turn = {"role": "assistant", "content": "a", "reasoning": "why"}
        source = (
            "{% set m = messages[1] %}{{ m.thinking }}|{{ m.reasoning_content }}|{{ m.reasoning }}"
        )
        assert render(source, {"messages": [user(), turn]}) == "why|why|why"

    def test_missing_messages_rejected(self) -> None:
        for request in ({}, {"messages": []}, {"messages": "x"}):
            with pytest.raises(Reject, match="missing_messages"):
                render(ECHO, request)


class TestContext:
    """Tools, and the keyword arguments the request's thinking options make."""

    def test_tools_unless_tool_choice_none(self) -> None:
        tools = [{"type": "function", "function": {"name": "a"}}]
        source = "{{ tools | tojson }}"
        assert render(source, {"messages": [user()], "tools": tools}) != "null"
        request = {"messages": [user()], "tools": tools, "tool_choice": "none"}
        assert render(source, request) == "null"

    @pytest.mark.parametrize(
        ("fields", "want"),
        [
            ({"chat_template_kwargs": {"k": 1}}, "k=1"),
            ({"chat_template_args": {"k": 2}}, "k=2"),
            ({"thinking": True}, "thinking=True thinking_mode=enabled"),
            ({"thinking": {"type": "disabled"}}, "thinking=False thinking_mode=disabled"),
            ({"thinking": {"type": "adaptive"}}, "thinking_mode=adaptive"),
            ({"reasoning_effort": "none"}, "enable_thinking=False reasoning_effort=none"),
            (
                {"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}},
                "enable_thinking=False reasoning_effort=high",
            ),
        ],
    )
    def test_thinking_options(self, fields: dict, want: str) -> None:
        names = ("k", "thinking", "thinking_mode", "enable_thinking", "reasoning_effort")
        echo = " ".join(f"{{% if {n} is defined %}}{n}={{{{ {n} }}}}{{% endif %}}" for n in names)
        got = " ".join(render(echo, {"messages": [user()], **fields}).split())
        assert got == want

    @pytest.mark.parametrize(
        "fields", [{"thinking": "yes"}, {"thinking": {"type": "other"}}, {"reasoning_effort": 3}]
    )
    def test_bad_thinking_options_rejected(self, fields: dict) -> None:
        with pytest.raises(Reject, match="invalid_field"):
            render(ECHO, {"messages": [user()], **fields})
