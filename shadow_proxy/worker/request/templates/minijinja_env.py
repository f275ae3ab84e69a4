"""Dynamo 1.6.1's MiniJinja chat-template environment, rebuilt with the PyPI binding.

Pure (no aiohttp, no zmq). Compiled once per model at worker start-up; renders
run in the tap worker. Dynamo's renderer (the ``dynamo-renderer`` crate in
1.6.1, built with minijinja 2.24) sets up its environment as follows, and so
does ``dynamo_environment``:

- trim and lstrip blocks on, trailing newline dropped, lenient undefined (an
  unknown name prints nothing, an attribute of it is a render error), no
  auto-escaping, ``{% break %}``/``{% continue %}``, minijinja-contrib's
  Python-method compatibility (``.strip()``, ``.items()``...);
- the formatter prints ``True``/``False``/``None`` and maps and lists with
  double-quoted strings (``{"k": True}``): values built by ``to_template_value``
  print that way (``DynDict``/``DynList``);
- filters: ``tojson`` as Python's ``json.dumps(..., ensure_ascii=False)`` with
  ``indent`` honoured and every other option ignored; ``string`` like the
  formatter; ``length`` 0 for none and undefined; ``fromjson``/``from_json``;
  ``trim`` with Python's whitespace set;
- globals ``raise_exception`` (a render error: the frontend answers 400) and
  ``strftime_now``;
- the source is rewritten before compiling (``rewrite_source``):
  ``{% generation %}`` blocks become ``{% with %}`` and ``.items()`` calls in
  code become the ``items`` filter, outside strings, comments and raw blocks.

Per request, messages made of strings only (plain chat, the usual case) reach
the template as MiniJinja's own maps in a list (``native_messages``), built by
a one-line wrapper that includes the template: the binding otherwise converts a
Python value at every read. Any other message keeps ``to_template_value``.

Known edge differences of the binding (values, not structure): a float printed
outside a container that needs an exponent (``1e300``) prints as a long
decimal; an integral float that crosses into a Python filter as a scalar
(``{{ x.n | tojson }}`` with ``n = 1.0``) loses its ``.0``; integers between
2**63 and 2**64 print as floats.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from typing import Any

import minijinja

from shadow_proxy.worker.request.templates.minijinja_source import rewrite_source

#: Python's ``str.strip()`` whitespace, which Dynamo's ``trim`` and ``.strip()`` use.
PY_WHITESPACE = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
_I64_MIN, _U64_END = -(2**63), 2**64


class DynDict(dict):
    """A JSON object as the template sees it: prints like Dynamo's formatter."""

    __slots__ = ()

    def __str__(self) -> str:
        return nested_repr(self)

    def keys(self):
        return DynList(super().keys())

    def values(self):
        return DynList(super().values())


class DynList(list):
    """A JSON array as the template sees it: prints like Dynamo's formatter."""

    __slots__ = ()

    def __str__(self) -> str:
        return nested_repr(self)


class ShortStr(str):
    """A short string for the binding, which takes it for a marked-safe one
    (``__html__``) and reads it without the three Python exceptions a plain
    ``str`` costs it (~4 us, at every ``message.role``). It renders, compares
    and filters as the plain one but for the escaping filters (``escapes``).
    Long strings stay plain: the binding would encode them twice."""

    __slots__ = ()

    def __html__(self) -> str:
        return self


#: The longest string ``to_template_value`` marks (``ShortStr``).
SHORT_STR = 64
_ESCAPING = re.compile(r"(?:\||\bfilter\s)\s*(?:e|escape|forceescape)\b|\bautoescape\b")


def escapes(source: str) -> bool:
    """Whether a template source escapes (the ``e``, ``escape``, ``forceescape``
    filters, a ``filter`` block of one, an ``autoescape`` block), which treats a
    marked-safe string otherwise."""
    return _ESCAPING.search(source) is not None


def to_template_value(value: Any, short: bool = False) -> Any:
    """A JSON value (from ``json.loads``) as Dynamo hands it to a template.

    Iterative (no recursion limit). Integers outside i64..u64 become floats, as
    serde_json without arbitrary precision reads them. ``short``: strings of
    at most ``SHORT_STR`` characters become ``ShortStr`` (cheaper to read).
    """
    root = [value]
    stack: list[tuple[Any, Any, Any]] = [(root, 0, value)]
    while stack:
        parent, key, item = stack.pop()
        if isinstance(item, dict):
            out: Any = DynDict(item)
            for k, v in item.items():
                kind = type(v)
                if kind is dict or kind is list or isinstance(v, (dict, list)) or _huge_int(v):
                    stack.append((out, k, v))
                elif short and kind is str and len(v) <= SHORT_STR:
                    out[k] = ShortStr(v)
        elif isinstance(item, list):
            out = DynList(item)
            for i, v in enumerate(item):
                kind = type(v)
                if kind is dict or kind is list or isinstance(v, (dict, list)) or _huge_int(v):
                    stack.append((out, i, v))
                elif short and kind is str and len(v) <= SHORT_STR:
                    out[i] = ShortStr(v)
        elif short and type(item) is str and len(item) <= SHORT_STR:
            out = ShortStr(item)
        else:
            out = float(item) if _huge_int(item) else item
        parent[key] = out
    return root[0]


#: The name ``native_messages``'s strings reach the template under.
NATIVE_STRINGS = "__shadow_proxy_strings"
#: What the wrapper calls that list once it has read it (one read of the name).
_STRINGS_READ = "__shadow_proxy_s"
#: Keys and values written into the literal as they are (no escaping needed).
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def native_messages(messages: list[Any], name: str) -> tuple[str, list[str]] | None:
    """A template source that renders template ``name`` with ``messages`` as
    MiniJinja's own maps and lists, and the strings it reads (``NATIVE_STRINGS``);
    None unless every message is a map of strings, keyed by plain names.

    Why: the binding converts a Python value each time a template reads it (a
    message at each loop, a role at each test), at two or three Python
    exceptions a read; a native value costs nothing to read. Each string is
    read once, from the list, when the literal is built; a short plain name (a
    role) is written into the source. The template sees what it saw before: the
    same keys in the same order, the same strings; a map or a list of strings
    prints and filters alike (``DynDict`` prints as MiniJinja prints such a
    map), and Dynamo hands its templates native values itself."""
    strings: list[str] = []
    entries = []
    for message in messages:
        if type(message) is not dict:
            return None
        fields = []
        for key, value in message.items():
            if type(value) is not str or type(key) is not str or not _BARE.fullmatch(key):
                return None
            if _BARE.fullmatch(value):
                fields.append(f'"{key}": "{value}"')
            else:
                fields.append(f'"{key}": {_STRINGS_READ}[{len(strings)}]')
                strings.append(value)
        entries.append("{" + ", ".join(fields) + "}")
    source = (
        f"{{% set {_STRINGS_READ} = {NATIVE_STRINGS} %}}"
        f"{{% set messages = [{', '.join(entries)}] %}}"
        f'{{% include "{name}" %}}'
    )
    return source, strings


def _huge_int(value: Any) -> bool:
    return type(value) is int and not _I64_MIN <= value < _U64_END


def _rust_float(value: float) -> str:
    """A float nested in a container, as minijinja's Debug form prints it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = repr(value)
    mantissa, sep, exponent = text.partition("e")
    if not sep:
        return text
    return f"{mantissa}e{int(exponent)}"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def _rust_str(value: str) -> str:
    """A string nested in a container, as Rust's ``{:?}`` prints it."""
    out = ['"']
    for ch in value:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            out.append(f"\\u{{{ord(ch):x}}}")
    out.append('"')
    return "".join(out)


def _scalar_repr(value: Any) -> str:
    if value is None:
        return "None"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, float):
        return _rust_float(value)
    if isinstance(value, str):
        return _rust_str(value)
    return str(value)


def nested_repr(value: Any) -> str:
    """How Dynamo's formatter prints a map or a list: ``{"k": [1, True, None]}``.
    Iterative, so a deeply nested value cannot exhaust the stack."""
    out: list[str] = []
    # Work items: a value to print, or a literal piece of text.
    work: list[tuple[bool, Any]] = [(False, value)]
    while work:
        literal, item = work.pop()
        if literal:
            out.append(item)
        elif isinstance(item, dict):
            pieces: list[tuple[bool, Any]] = [(True, "{")]
            for i, (k, v) in enumerate(item.items()):
                if i:
                    pieces.append((True, ", "))
                pieces += [(False, k), (True, ": "), (False, v)]
            pieces.append((True, "}"))
            work.extend(reversed(pieces))
        elif isinstance(item, (list, tuple)):
            pieces = [(True, "[")]
            for i, v in enumerate(item):
                if i:
                    pieces.append((True, ", "))
                pieces.append((False, v))
            pieces.append((True, "]"))
            work.extend(reversed(pieces))
        else:
            out.append(_scalar_repr(item))
    return "".join(out)


def python_string(value: Any = None) -> Any:
    """The ``string`` filter: strings as they are, other values as the formatter prints."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return _scalar_repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else _rust_float(value)
    if isinstance(value, (dict, list, tuple)):
        return nested_repr(value)
    return str(value)


def tojson(value: Any = None, indent: int | None = None, **_ignored: Any) -> Any:
    """Dynamo's ``tojson``: ``json.dumps(value, ensure_ascii=False, indent=indent)``;
    ``ensure_ascii``, ``separators`` and ``sort_keys`` are accepted and ignored."""
    return minijinja.safe(json.dumps(value, ensure_ascii=False, indent=indent))


def length(value: Any = None) -> int:
    """``length``: 0 for none and undefined (templates test ``tools | length``)."""
    if value is None:
        return 0
    try:
        return len(value)
    except TypeError:
        return 0


def fromjson(value: str) -> Any:
    return to_template_value(json.loads(value))


def trim(value: Any, chars: str | None = None) -> str:
    return str(value).strip(chars if chars else PY_WHITESPACE)


def raise_exception(message: Any = "") -> None:
    raise minijinja.TemplateError(str(message))


def strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def dynamo_environment(templates: dict[str, str]) -> minijinja.Environment:
    """An environment set up as Dynamo 1.6.1's, holding ``templates`` (name ->
    source, rewritten by ``rewrite_source`` here). Raises ``minijinja.TemplateError``
    when a source does not compile."""
    env = minijinja.Environment(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        undefined_behavior="lenient",
        pycompat=True,
        auto_escape_callback=lambda _name: False,
        filters={
            "tojson": tojson,
            "string": python_string,
            "length": length,
            "fromjson": fromjson,
            "from_json": fromjson,
            "trim": trim,
        },
        globals={"raise_exception": raise_exception, "strftime_now": strftime_now},
    )
    for name, source in templates.items():
        env.add_template(name, rewrite_source(source))
    return env
