"""Configuration files for the config tests: a minimal valid file, loading one
from a temporary directory, and what a rejection's message must name."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from shadow_proxy.config import Config, ConfigError

#: The smallest valid configuration (taps and other sections are appended).
BASE = """\
schema_version: 1
upstream:
  url: http://127.0.0.1:9
"""


def load(tmp_path: Path, text: str, name: str = "proxy.yaml") -> Config:
    """Write ``text`` (dedented) to ``tmp_path/name`` and load it."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return Config.from_yaml(path)


def rejected(tmp_path: Path, text: str) -> str:
    """The one-line error message loading ``text`` fails with."""
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def assert_names(message: str, tmp_path: Path, line: int, key: str, *values: str) -> None:
    """The message starts with ``file:line:``, quotes the key and names each value."""
    assert message.startswith(f"{tmp_path / 'proxy.yaml'}:{line}: "), message
    assert f"'{key}'" in message, message
    for value in values:
        assert value in message, message


def with_taps(body: str, sections: str = "") -> str:
    """``BASE``, then ``sections``, then a ``taps`` list of ``body`` (YAML, dedented)."""
    return BASE + sections + "taps:\n" + textwrap.indent(textwrap.dedent(body), "  ")
