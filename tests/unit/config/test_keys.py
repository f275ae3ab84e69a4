"""A key's field says its YAML type; the reader reads a value class by its keys alone."""

from __future__ import annotations

import enum

import attrs
import pytest

from shadow_proxy.config.keys import key, keys, type_doc, yaml_kinds
from shadow_proxy.config.reader import ConfigError, Reader


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen
class Inner:
    size: int = key("A size.", 1)


@attrs.frozen
class Sample:
    name: str = key("Required.")
    count: int | None = key("Optional.", None)
    color: Color = key("A choice.", Color.RED, converter=Color)
    tags: tuple[str, ...] = key("A list.", ())
    label: str = key("Derived.", "", derive=lambda values, _: f"x-{values['name']}")
    inner: Inner = key("A section.", factory=Inner)


class TestTypes:
    def test_yaml_kinds_and_docs(self) -> None:
        fields = {f.name: f for f in keys(Sample)}
        assert yaml_kinds(fields["count"].type) == (int, type(None))
        assert yaml_kinds(fields["tags"].type) == (list, type(None))
        assert type_doc(fields["color"].type) == "`red` \\| `blue`"
        assert type_doc(fields["tags"].type) == "list of strings"


class TestRead:
    """A value class read from a mapping by its keys: defaults, derived defaults,
    choices, lists and sections; unknown keys and wrong values refused."""

    def test_defaults_and_values(self) -> None:
        reader = Reader("f.yaml")
        got = reader.read(Sample, {"name": "a", "tags": ["t"], "inner": {"size": 3}}, "")
        assert got == Sample("a", None, Color.RED, ("t",), "x-a", Inner(3))
        assert reader.read(Sample, {"name": "a", "color": "blue"}, "").color is Color.BLUE

    @pytest.mark.parametrize(
        ("mapping", "expected"),
        [
            ({}, "'name' is required"),
            ({"name": "a", "colour": "red"}, "'colour' is not a known key"),
            ({"name": "a", "color": "green"}, "'color' must be one of red, blue"),
            ({"name": "a", "count": "3"}, "'count' must be an integer or null"),
            ({"name": "a", "inner": {"size": "x"}}, "'inner.size' must be an integer"),
        ],
    )
    def test_refused(self, mapping: dict, expected: str) -> None:
        with pytest.raises(ConfigError, match=expected):
            Reader("f.yaml").read(Sample, mapping, "")
