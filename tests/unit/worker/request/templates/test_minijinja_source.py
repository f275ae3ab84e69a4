"""Dynamo's pre-compile rewrite of a chat template's source."""

from __future__ import annotations

from shadow_proxy.worker.request.templates.minijinja_source import rewrite_source


class TestRewrite:
    """Dynamo's pre-compile rewrite of a template's source."""

    def test_source_rewrite_skips_strings_comments_and_raw(self) -> None:
        source = (
            "{{ a.items() }}{% for k in b.items() -%}{%- generation %}"
            "{{ 'c.items()' }}{# d.items() #}{% raw %}{{ e.items() }}{% endraw %}"
        )
        assert rewrite_source(source) == (
            "{{ a|items }}{% for k in b|items -%}{%- with %}"
            "{{ 'c.items()' }}{# d.items() #}{% raw %}{{ e.items() }}{% endraw %}"
        )

    def test_endgeneration_and_unclosed_tags(self) -> None:
        assert rewrite_source("{% endgeneration %}") == "{% endwith %}"
        assert rewrite_source("{{ a.items()") == "{{ a.items()"
        assert rewrite_source("{{ '}}'.items() }}") == "{{ '}}'|items }}"
