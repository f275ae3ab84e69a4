"""models[].template_engine: minijinja by default (Dynamo), jinja2 on request, nothing else."""

from __future__ import annotations

import pytest

from shadow_proxy.config import Config, ConfigError


def config(**entry) -> Config:
    model = {"name": "m", "tokenizer": ".models/chatml", **entry}
    return Config.from_mapping(
        {"schema_version": 1, "upstream": {"url": "http://x"}, "models": [model]}
    )


class TestTemplateEngine:
    def test_default_is_dynamos(self) -> None:
        assert config().models[0].template_engine == "minijinja"

    def test_jinja2(self) -> None:
        assert config(template_engine="jinja2").models[0].template_engine == "jinja2"

    def test_unknown_named(self) -> None:
        with pytest.raises(ConfigError, match=r"models\[0\]\.template_engine.*minijinja, jinja2"):
            config(template_engine="jinja")
