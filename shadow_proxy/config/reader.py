"""Reading a YAML configuration strictly: line numbers, typed values, checks.

The generic part of the configuration: ``Reader.read`` builds a value class from
a mapping by its keys (``keys.py``: the fields' types, defaults, checks and
rules); ``schema.py`` adds what spans keys (lists of models and taps, names
unique across them). Every error is a ``ConfigError`` (a ``ValueError``) whose text names the
file, the line where YAML knows it, the key, what was expected and what was
given: ``proxy.yaml:7: 'taps[replay].capacity' must be at least 1 (got 0)``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs
import yaml

from shadow_proxy.config.keys import (
    is_choice,
    is_section,
    keys,
    meta,
    optional,
    yaml_kinds,
)

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
_SUBJECT_RE = re.compile(r"^[^\s.*>]+(\.[^\s.*>]+)*$")


class ConfigError(ValueError):
    """The configuration is invalid; the message says where and why."""


class Lines(dict):
    """A mapping that remembers the line of each key (1-based) and its own."""

    line: int = 0
    key_lines: dict[str, int]


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice (YAML says keys are unique; PyYAML
    would keep the last one silently)."""

    def __init__(self, key: str, first_line: int, line: int):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first_line, self.line = key, first_line, line


class LineLoader(yaml.SafeLoader):
    """A SafeLoader whose mappings are ``Lines``: they know where each key stands.

    A key given twice in one mapping is an error naming both lines: two
    ``port:`` lines or two ``taps:`` blocks must not silently change what is
    served or mirrored.
    """

    def construct_yaml_map(self, node):
        first: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                key_node, yaml.ScalarNode
            ):
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in first:
                raise DuplicateKeyError(str(key), first[key], line)
            first[key] = line
        data = Lines()
        data.line = node.start_mark.line + 1
        data.key_lines = {}
        yield data
        data.update(self.construct_mapping(node))
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            data.key_lines[str(key)] = key_node.start_mark.line + 1


LineLoader.add_constructor("tag:yaml.org,2002:map", LineLoader.construct_yaml_map)


MISSING = object()


def load_yaml(text: str, path: str) -> Any:
    """The YAML document in ``text``, its mappings as ``Lines``."""
    try:
        return yaml.load(text, Loader=LineLoader)
    except DuplicateKeyError as e:
        msg = (
            f"{path}:{e.line}: '{e.key}' is given twice (lines {e.first_line} and {e.line}); "
            "a key may appear once per mapping"
        )
        raise ConfigError(msg) from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        msg = f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})"
        raise ConfigError(msg) from e


def plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class Reader:
    """Walks loaded YAML: typed values, known keys, errors with their line."""

    def __init__(self, path: str):
        self.path = path
        #: The line of every key read (``listen.port``, ``taps[a].endpoint``), or
        #: of its mapping when the key is absent: for errors found later (a
        #: port in use, a tokenizer that does not load).
        self.lines: dict[str, int] = {}

    def note(self, mapping: Mapping, key: str, name: str) -> None:
        """Remember where ``name`` (read as ``key`` of ``mapping``) stands."""
        line = getattr(mapping, "key_lines", {}).get(key) or getattr(mapping, "line", 0)
        if line:
            self.lines[name] = line

    def fail(self, where: Mapping | None, key: str, expected: str, got: Any = MISSING) -> None:
        line = getattr(where, "key_lines", {}).get(key.rsplit(".", 1)[-1]) or getattr(
            where, "line", 0
        )
        loc = f"{self.path}:{line}" if line else self.path
        given = "" if got is MISSING else f" (got {got!r})"
        msg = f"{loc}: '{key}' {expected}{given}"
        raise ConfigError(msg)

    def section(self, parent: Mapping, key: str, prefix: str, allowed: set[str]) -> Mapping:
        value = parent.get(key, MISSING)
        if value is MISSING or value is None:
            return Lines()
        if not isinstance(value, Mapping):
            self.fail(parent, f"{prefix}{key}", "must be a mapping", value)
        self.note(parent, key, f"{prefix}{key}")
        self.known(value, f"{prefix}{key}.", allowed)
        return value

    def known(self, mapping: Mapping, prefix: str, allowed: set[str]) -> None:
        for key in mapping:
            if key not in allowed:
                expected = "is not a known key; expected one of " + ", ".join(sorted(allowed))
                self.fail(mapping, f"{prefix}{key}", expected)

    def get(
        self,
        mapping: Mapping,
        key: str,
        prefix: str,
        kind: type | tuple[type, ...],
        default: Any = MISSING,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        name = f"{prefix}{key}"
        self.note(mapping, key, name)
        value = mapping.get(key, MISSING)
        if value is MISSING:
            if default is MISSING:
                self.fail(mapping, name, "is required")
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            names = " or ".join(k.__name__ for k in kinds).replace("NoneType", "null")
            names = names.replace("str", "a string").replace("int", "an integer")
            names = names.replace("float", "a number").replace("bool", "true or false")
            self.fail(mapping, name, f"must be {names}", value)
        if check is not None and value is not None:
            problem = check(value)
            if problem:
                self.fail(mapping, name, problem, value)
        return value

    def read(
        self, cls: type, mapping: Mapping, prefix: str, context: Any = None, **given: Any
    ) -> Any:
        """An instance of value class ``cls`` from ``mapping``: every key of ``cls``
        (``keys.py``) read with its type, default, check and rules; unknown keys
        are errors. ``given``: fields the caller reads itself (lists of sections).
        Keys with a derived default or a rule are read after the others."""
        fields = keys(cls)
        self.known(mapping, prefix, {f.name for f in fields})
        values: dict[str, Any] = dict(given)
        later = [f for f in fields if meta(f).derive is not None or meta(f).allowed is not None]
        for field in [f for f in fields if f not in later] + later:
            if field.name not in given:
                values[field.name] = self._read_key(field, mapping, prefix, values, context)
        return cls(**values)

    def _read_key(
        self,
        field: attrs.Attribute,
        mapping: Mapping,
        prefix: str,
        values: dict[str, Any],
        context: Any,
    ) -> Any:
        key, name, rules = field.name, f"{prefix}{field.name}", meta(field)
        present = mapping.get(key, MISSING) is not MISSING
        if present and rules.allowed is not None:
            problem = rules.allowed(values)
            if problem:
                self.fail(mapping, name, problem, mapping[key])
        if rules.derive is not None:
            default = rules.derive(values, context)
        elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            default = field.default.factory()  # type: ignore[union-attr]
        elif field.default is attrs.NOTHING:
            default = MISSING
        else:
            default = field.default
        inner, _ = optional(field.type)
        raw = mapping.get(key, MISSING)
        if rules.required and (raw is MISSING or raw is None):
            self.fail(mapping, name, rules.required)
        if is_section(inner) and rules.yaml is None:
            if raw is MISSING or raw is None:
                self.note(mapping, key, name)
                return default
            section = self.section(mapping, key, prefix, {f.name for f in keys(inner)})
            return self.read(inner, section, f"{name}.", context)
        kinds = yaml_kinds(field.type, rules.yaml)
        if raw is not MISSING and rules.expected and not _is_kind(raw, kinds):
            self.fail(mapping, name, rules.expected, raw)
        check = rules.check
        if check is None and is_choice(inner):
            check = choice(*inner)
        value = self.get(mapping, key, prefix, kinds, default, check)
        if is_choice(inner) and isinstance(value, str):
            value = inner(value)
        elif value is None and list in kinds:
            value = default
        elif isinstance(value, list):
            value = tuple(value)
        if rules.parse is not None:
            try:
                value = rules.parse(value, context)
            except ConfigError:
                raise
            except ValueError as e:  # the value's own check (filters, say)
                self.fail(mapping, name, str(e))
        return value


def _is_kind(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds) or (float in kinds and isinstance(value, int))


# -- checks: None when the value is fine, else what is expected ---------------------


def name(value: str) -> str | None:
    return None if NAME_RE.match(value) else "must match [A-Za-z0-9_-]+"


def non_empty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


def header_name(value: str) -> str | None:
    return None if re.match(r"^[A-Za-z0-9-]+$", value) else "must be an HTTP header name"


def port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "must be a port number (0 to 65535)"


def at_least_1(value: int) -> str | None:
    return None if value >= 1 else "must be at least 1"


def positive(value: float) -> str | None:
    return None if value > 0 and math.isfinite(value) else "must be a positive number"


def non_negative(value: float) -> str | None:
    return None if value >= 0 and math.isfinite(value) else "must be zero or more"


def niceness(value: int) -> str | None:
    return None if 0 <= value <= 19 else "must be between 0 and 19"


def malloc(value: str) -> str | None:
    if value in ("auto", "system"):
        return None
    if not os.path.isabs(value):
        return "must be auto, system or the absolute path of a malloc library"
    return None if os.path.isfile(value) else f"no such file: {value}"


def fraction(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else "must be between 0 and 1"


def http_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be an http:// or https:// URL"
    return None


def zmq_endpoint(value: str) -> str | None:
    if re.match(r"^(tcp://[^\s/]+:\d+|ipc://\S+|inproc://\S+)$", value):
        return None
    return "must be a ZeroMQ endpoint such as tcp://0.0.0.0:5557 or ipc:///path"


def nats_subject(value: str) -> str | None:
    if _SUBJECT_RE.match(value):
        return None
    return "must be a NATS subject: dot-separated tokens, no spaces and no wildcards (* or >)"


def nats_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in NATS_SCHEMES or not parts.hostname:
        return "must be a NATS server URL such as nats://host:4222"
    return None


def choice(*choices: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in choices else "must be one of " + ", ".join(choices)

    return check
