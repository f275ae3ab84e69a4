"""Dynamo 1.6.1's MiniJinja environment, rebuilt with the PyPI binding: options,
filters, the formatter's printing of values, globals and the source rewrite,
rendered through ``dynamo_environment`` itself (no chat request around it)."""

from __future__ import annotations

import math

import minijinja
import pytest

from shadow_proxy.worker.request.templates.minijinja_env import (
    DynDict,
    DynList,
    ShortStr,
    dynamo_environment,
    escapes,
    nested_repr,
    python_string,
    to_template_value,
    trim,
)

VALUES = {
    "x": {"u": "ü <&>", "f": 1.0, "l": [True, None]},
    "schema": {"type": "array", "items": {"type": "string"}},
}


def render(source: str, short: bool | None = None, **context: object) -> str:
    """``source`` rendered in Dynamo's environment, values handed over as Dynamo does
    (short strings as ``ShortStr`` unless the source escapes, as ``DynamoTemplate``
    hands them; ``short`` forces either)."""
    env = dynamo_environment({"t": source})
    if short is None:
        short = not escapes(source)
    values = {key: to_template_value(value, short) for key, value in {**VALUES, **context}.items()}
    return env.render_template("t", **values)


class TestEnvironment:
    """Filters, formatter, globals and options of Dynamo's environment."""

    @pytest.mark.parametrize(
        ("source", "want"),
        [
            ("{{ {'b': true, 'n': none, 's': 'it\\'s'} }}", '{"b": True, "n": None, "s": "it\'s"}'),
            ("{{ [1, 'a', false] }}", '[1, "a", False]'),
            ("{{ x | tojson }}", '{"u": "ü <&>", "f": 1.0, "l": [true, null]}'),
            (
                "{{ x | tojson(indent=2, sort_keys=true, ensure_ascii=true) }}",
                '{\n  "u": "ü <&>",\n  "f": 1.0,\n  "l": [\n    true,\n    null\n  ]\n}',
            ),
            ("{{ x }}", '{"u": "ü <&>", "f": 1.0, "l": [True, None]}'),
            ("{{ x | string }}", '{"u": "ü <&>", "f": 1.0, "l": [True, None]}'),
            ("[{{ nosuch }}]{{ nosuch | length }}{{ none | length }}", "[]00"),
            ("{{ ('{\"k\": [1, true]}' | fromjson).k }}", "[1, True]"),
            ("{{ ('[1]' | from_json) | length }}", "1"),
            ("{% for k, v in x.items() %}{{ k }};{% endfor %}", "u;f;l;"),
            ("{% for k, v in schema.items() %}{{ k }};{% endfor %}", "type;items;"),
            ("{{ '.items()' }}", ".items()"),
            ("{% generation %}G{% endgeneration %}", "G"),
            (
                "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}",
                "01",
            ),
            ("{{ '<&>' }}|{{ '<a>' | e }}", "<&>|&lt;a&gt;"),
            ("{{ x.u | e }}|{{ x.u | escape }}", "ü &lt;&amp;&gt;|ü &lt;&amp;&gt;"),
            ("{% filter escape %}{{ x.u }}{% endfilter %}", "ü &lt;&amp;&gt;"),
            ("{% autoescape true %}{{ x.u }}{% endautoescape %}", "ü &lt;&amp;&gt;"),
            ("{{ x.u ~ '!' }}|{{ x.u == 'ü <&>' }}|{{ x.u | upper }}", "ü <&>!|True|Ü <&>"),
            ("{{ x.u | tojson }}|{{ x.u | string }}|{{ x.u | length }}", '"ü <&>"|ü <&>|5'),
            ("{{ '  a \u00a0' | trim }}|{{ 'xax' | trim('x') }}", "a|a"),
            ("{{ '  a  '.strip() }}", "a"),
            ("{% if true %}\n  A\n{% endif %}B", "  A\nB"),
            ("X\n", "X"),
        ],
    )
    def test_expression(self, source: str, want: str) -> None:
        assert render(source) == want
        if not escapes(source):  # short strings read as plain ones
            assert render(source, short=True) == render(source, short=False)

    def test_raise_exception_and_undefined_attribute_fail(self) -> None:
        with pytest.raises(minijinja.TemplateError, match="boom"):
            render("{{ raise_exception('boom') }}")
        with pytest.raises(minijinja.TemplateError, match="undefined"):
            render("{{ nosuch.attr }}")

    def test_strftime_now(self) -> None:
        assert len(render("{{ strftime_now('%Y') }}")) == 4

    def test_a_source_that_does_not_compile(self) -> None:
        with pytest.raises(minijinja.TemplateError):
            dynamo_environment({"t": "{% for %}"})


class TestValues:
    """JSON values print as Dynamo's formatter prints them."""

    def test_short_strings(self) -> None:
        value = to_template_value({"r": "user", "c": "x" * 65, "l": ["a"]}, short=True)
        assert type(value["r"]) is ShortStr and type(value["l"][0]) is ShortStr
        assert type(value["c"]) is str  # long: plain
        assert value == {"r": "user", "c": "x" * 65, "l": ["a"]}
        assert type(to_template_value({"r": "user"})["r"]) is str

    def test_escaping_sources(self) -> None:
        assert escapes("{{ x | e }}") and escapes("{{ x|escape }}") and escapes("{{x|forceescape}}")
        assert escapes("{% filter escape %}{{ x }}{% endfilter %}")
        assert escapes("{% autoescape true %}{{ x }}{% endautoescape %}")
        assert not escapes("{{ x | eq }}") and not escapes("{{ x | trim }}{{ e }}")

    def test_containers_print_like_the_formatter(self) -> None:
        value = to_template_value({"k": [1, 2.5, 'a"\n', None, False]})
        assert isinstance(value, DynDict) and isinstance(value["k"], DynList)
        assert str(value) == '{"k": [1, 2.5, "a\\"\\n", None, False]}'
        assert str(value.keys()) == '["k"]'

    def test_integers_outside_i64_u64_become_floats(self) -> None:
        value = to_template_value({"big": 2**64, "neg": -(2**63) - 1, "ok": 2**64 - 1})
        assert value == {"big": float(2**64), "neg": float(-(2**63) - 1), "ok": 2**64 - 1}
        assert type(value["ok"]) is int

    def test_nested_floats_and_strings_as_rust_prints_them(self) -> None:
        assert nested_repr([1e300, math.inf, -math.inf]) == "[1e300, inf, -inf]"
        assert nested_repr([math.nan, 0.5]) == "[NaN, 0.5]"
        assert nested_repr(["\t\0\x07"]) == '["\\t\\0\\u{7}"]'

    def test_string_filter(self) -> None:
        assert [python_string(v) for v in ("s", None, True, 1.0, [1], 3)] == [
            "s",
            "None",
            "True",
            "1.0",
            "[1]",
            "3",
        ]

    def test_trim_uses_python_whitespace(self) -> None:
        assert trim("\u2003a\u3000") == "a"

    def test_deep_values_are_not_recursive(self) -> None:
        deep: object = 1
        for _ in range(20_000):
            deep = {"k": [deep]}
        value = to_template_value(deep)
        assert nested_repr(value).startswith('{"k": [{"k": [')
