"""Chat templates rendered as vLLM 0.32 renders them (``template_engine:
jinja2``): transformers' sandbox and helpers, messages, tools and template
arguments as vLLM hands them over, its reading of a template's content format."""

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
    """Messages as vLLM 0.32 rebuilds them: its keys only, content by the
    template's content format, arguments parsed, reasoning under both names."""

    def test_only_vllms_keys(self) -> None:
        message = {"role": "user", "content": "c", "name": "al", "extra": 1, "weight": None}
        assert render(ECHO, {"messages": [message]}).split("\n")[0] == (
            '{"role": "user", "content": "c", "name": "al"}'
        )

    def test_string_format_joins_text_parts(self) -> None:
        text = {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
        assert render(ECHO, {"messages": [text]}).split("\n")[0] == (
            '{"role": "user", "content": "a\\nb"}'
        )

    def test_openai_format_keeps_parts(self) -> None:
        source = (
            "{% for m in messages %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endfor %}"
        )
        text = {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "r"}],
        }
        assert render(source, {"messages": [text]}) == "[a][r]"

    @pytest.mark.parametrize(
        ("source", "want"),
        [
            (ECHO, '""'),
            (
                "{% for m in messages %}{% for p in m['content'] %}{% endfor %}"
                "{{ m.content | tojson }}{% endfor %}",
                "[]",
            ),
        ],
    )
    def test_null_content_by_format(self, source: str, want: str) -> None:
        turn = {"role": "assistant", "content": None}
        got = render(source, {"messages": [turn]})
        assert got.startswith(f'{{"role": "assistant", "content": {want}}}') or got == want

    def test_arguments_parsed(self) -> None:
        call = {"id": "c", "function": {"name": "f", "arguments": '{"a": 1}'}}
        turn = {"role": "assistant", "tool_calls": [call]}
        source = "{{ messages[1].tool_calls[0].function.arguments.a }}"
        assert render(source, {"messages": [user(), turn]}) == "1"

    @pytest.mark.parametrize("arguments", ["[1]", "{bad", ""])
    def test_bad_arguments_become_an_empty_object(self, arguments: str) -> None:
        call = {"id": "c", "function": {"name": "f", "arguments": arguments}}
        source = "{{ messages[1].tool_calls[0].function.arguments | tojson }}"
        assert (
            render(source, {"messages": [user(), {"role": "assistant", "tool_calls": [call]}]})
            == "{}"
        )

    def test_reasoning_under_both_names(self) -> None:
        turn = {"role": "assistant", "content": "a", "reasoning_content": "why"}
        source = (
            "{% set m = messages[1] %}{{ m.thinking }}|{{ m.reasoning_content }}|{{ m.reasoning }}"
        )
        assert render(source, {"messages": [user(), turn]}) == "|why|why"

    def test_missing_messages_rejected(self) -> None:
        for request in ({}, {"messages": []}, {"messages": "x"}):
            with pytest.raises(Reject, match="missing_messages"):
                render(ECHO, request)


class TestContext:
    """Tools as vLLM dumps them, and the template arguments vLLM passes on."""

    def test_tools_also_with_tool_choice_none(self) -> None:
        tools = [{"type": "function", "function": {"name": "a", "x": 1}, "y": 2}]
        source = "{{ tools | tojson }}"
        dumped = (
            '[{"type": "function", "function": {"name": "a", "description": null, '
            '"parameters": null}}]'
        )
        assert render(source, {"messages": [user()], "tools": tools}) == dumped
        assert (
            render(source, {"messages": [user()], "tools": tools, "tool_choice": "none"}) == dumped
        )

    @pytest.mark.parametrize(
        ("fields", "want"),
        [
            ({"chat_template_kwargs": {"k": 1}}, "k=1"),
            ({"chat_template_args": {"k": 2}}, ""),
            ({"thinking": True}, ""),
            ({"reasoning_effort": "none"}, "enable_thinking=False reasoning_effort=none"),
            (
                {"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}},
                "enable_thinking=False reasoning_effort=high",
            ),
            ({"chat_template_kwargs": {"unread": 1}}, ""),
        ],
    )
    def test_template_arguments(self, fields: dict, want: str) -> None:
        names = ("k", "thinking", "thinking_mode", "enable_thinking", "reasoning_effort")
        echo = " ".join(f"{{% if {n} is defined %}}{n}={{{{ {n} }}}}{{% endif %}}" for n in names)
        got = " ".join(render(echo, {"messages": [user()], **fields}).split())
        assert got == want

    def test_request_level_options_win(self) -> None:
        request = {
            "messages": [user()],
            "add_generation_prompt": False,
            "chat_template_kwargs": {"add_generation_prompt": True},
        }
        assert render("G={{ add_generation_prompt }}", request) == "G=False"

    @pytest.mark.parametrize("key", ["messages", "tools"])
    def test_an_argument_given_twice_fails(self, key: str) -> None:
        with pytest.raises(TypeError):
            render(ECHO, {"messages": [user()], "chat_template_kwargs": {key: []}})

    def test_continue_final_message(self) -> None:
        source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
        request = {
            "messages": [user("Count:"), {"role": "assistant", "content": "one, two,"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        assert render(source, request) == "<user>Count:</user><assistant>one, two,"
        with pytest.raises(ValueError, match="not compatible"):
            render(source, {**request, "add_generation_prompt": True})


class TestContentFormat:
    """vLLM's reading of a template: openai when it loops over a message's content."""

    @pytest.mark.parametrize(
        ("source", "fmt"),
        [
            ("{% for m in messages %}{{ m.content }}{% endfor %}", "string"),
            ("{% for m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}", "openai"),
            (
                "{% for m in messages %}{% for p in m['content'] %}{% endfor %}{% endfor %}",
                "openai",
            ),
            (
                "{% set ms = messages[1:] %}{% for m in ms %}{% for p in m.content | list %}"
                "{% endfor %}{% endfor %}",
                "openai",
            ),
            (
                "{% macro t(c) %}{% for p in c %}{% endfor %}{% endmacro %}"
                "{% for m in messages %}{{ t(m.content) }}{% endfor %}",
                "openai",
            ),
            (
                "{% macro t(c) %}{% for p in c %}{% endfor %}{% endmacro %}"
                "{% for m in messages %}{{ t(m.role) }}{% endfor %}",
                "string",
            ),
        ],
    )
    def test_detected(self, source: str, fmt: str) -> None:
        assert Jinja2Template(source, {}).content_format == fmt
