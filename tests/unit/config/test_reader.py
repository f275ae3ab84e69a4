"""The strict YAML reader: lines of keys, typed values, checks, errors that name all."""

from __future__ import annotations

import math

import pytest

from shadow_proxy.config import reader
from shadow_proxy.config.reader import MISSING, ConfigError, Lines, Reader, load_yaml, plain

TEXT = """\
top: 1
section:
  port: 8080
  name: kv
  ratio: 0.5
  flag: true
  nothing: null
items:
  - {a: 1}
"""


@pytest.fixture
def doc() -> Lines:
    return load_yaml(TEXT, "f.yaml")


class TestLoadYaml:
    """Mappings remember the line of each key; broken YAML names the file and line."""

    def test_key_lines(self, doc: Lines) -> None:
        assert isinstance(doc, Lines)
        assert doc.key_lines == {"top": 1, "section": 2, "items": 8}
        assert doc["section"].line == 3
        assert doc["section"].key_lines["name"] == 4
        assert doc["items"][0].line == 9

    def test_broken_yaml(self) -> None:
        with pytest.raises(ConfigError, match=r"^f\.yaml:2: not valid YAML \(mapping values"):
            load_yaml("a: 1\n  b: 2\n", "f.yaml")

    def test_plain_drops_the_line_bookkeeping(self, doc: Lines) -> None:
        value = plain(doc)
        assert type(value) is dict and type(value["section"]) is dict
        assert value["items"] == [{"a": 1}]


class TestGet:
    """Typed values: the type, the default, the check; errors name key, line and value."""

    def test_typed_values(self, doc: Lines) -> None:
        r, section = Reader("f.yaml"), doc["section"]
        assert r.get(section, "port", "section.", int) == 8080
        assert r.get(section, "ratio", "section.", float) == 0.5
        assert r.get(section, "flag", "section.", bool) is True
        assert r.get(section, "nothing", "section.", (float, type(None))) is None

    def test_an_integer_where_a_number_is_asked_becomes_a_float(self, doc: Lines) -> None:
        value = Reader("f.yaml").get(doc["section"], "port", "section.", float)
        assert value == 8080.0 and type(value) is float

    def test_default_and_required(self, doc: Lines) -> None:
        r = Reader("f.yaml")
        assert r.get(doc, "absent", "", int, 7) == 7
        with pytest.raises(ConfigError, match=r"^f\.yaml:1: 'absent' is required$"):
            r.get(doc, "absent", "", int)

    def test_wrong_type_names_key_line_expectation_and_value(self, doc: Lines) -> None:
        with pytest.raises(ConfigError) as caught:
            Reader("f.yaml").get(doc["section"], "name", "section.", int)
        assert str(caught.value) == "f.yaml:4: 'section.name' must be an integer (got 'kv')"

    def test_a_bool_is_not_an_integer(self, doc: Lines) -> None:
        with pytest.raises(ConfigError, match=r"'section\.flag' must be an integer \(got True\)"):
            Reader("f.yaml").get(doc["section"], "flag", "section.", int)

    def test_check(self, doc: Lines) -> None:
        with pytest.raises(ConfigError, match=r"^f\.yaml:3: 'section\.port' must be at least 9000"):
            Reader("f.yaml").get(
                doc["section"],
                "port",
                "section.",
                int,
                check=lambda v: None if v >= 9000 else "must be at least 9000",
            )


class TestSections:
    """Unknown keys are errors; a section must be a mapping."""

    def test_unknown_key_lists_the_known_ones(self, doc: Lines) -> None:
        with pytest.raises(ConfigError) as caught:
            Reader("f.yaml").section(doc, "section", "", {"port", "name"})
        assert str(caught.value).startswith("f.yaml:5: 'section.ratio' is not a known key")
        assert "expected one of name, port" in str(caught.value)

    def test_missing_section_is_empty(self, doc: Lines) -> None:
        assert Reader("f.yaml").section(doc, "absent", "", set()) == {}

    def test_not_a_mapping(self, doc: Lines) -> None:
        with pytest.raises(ConfigError, match=r"'top' must be a mapping \(got 1\)"):
            Reader("f.yaml").section(doc, "top", "", set())

    def test_a_plain_dict_has_no_lines(self) -> None:
        with pytest.raises(ConfigError, match=r"^<config>: 'x' is required$"):
            Reader("<config>").get({}, "x", "", int)
        assert MISSING is not None


class TestChecks:
    """Each check says what is expected, or None when the value is fine."""

    @pytest.mark.parametrize(
        ("check", "good", "bad"),
        [
            (reader.name, "kv-history_1", "kv.history"),
            (reader.non_empty, "x", "  "),
            (reader.header_name, "x-request-id", "x request"),
            (reader.port, 65535, 65536),
            (reader.at_least_1, 1, 0),
            (reader.positive, 0.1, 0.0),
            (reader.positive, 1.0, math.inf),
            (reader.non_negative, 0.0, -0.1),
            (reader.niceness, 19, 20),
            (reader.fraction, 1.0, 1.01),
            (reader.http_url, "https://a:1/x", "ftp://a"),
            (reader.http_url, "http://a", "http://"),
            (reader.zmq_endpoint, "tcp://0.0.0.0:5557", "tcp://host"),
            (reader.zmq_endpoint, "ipc:///tmp/x", "udp://a:1"),
            (reader.choice("a", "b"), "a", "c"),
        ],
    )
    def test_good_and_bad(self, check, good, bad) -> None:
        assert check(good) is None
        problem = check(bad)
        assert isinstance(problem, str) and problem.startswith("must")
