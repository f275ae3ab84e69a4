"""One definition per configuration key: the value classes' attrs fields. Pure.

A key is an attrs field made with ``key``: its name is the YAML key, its type
annotation the YAML type (``int``, ``float``, ``str``, ``bool``, an
``enum.StrEnum``, ``X | None``, ``tuple[str, ...]`` for a list of strings, a
nested value class for a section), its default the default, and its metadata
(``Key``) the check, the doc and what the reader needs beyond that. The reader
(``reader.Reader.read``), the docs table and the example configuration
(``docs.py``) all read the same fields, so a key is added in one place.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import attrs

#: The metadata entry of a key's field.
KEY = "shadow_proxy.config.key"


@attrs.frozen
class Key:
    """What the reader, the docs and the example know of one key."""

    #: One or two sentences for the docs table and the example's comment.
    doc: str
    #: None when a value is fine, else what is expected (``reader``'s checks).
    check: Callable[[Any], str | None] | None = None
    #: A value derived from the keys read before it, when the key is absent
    #: (``values``: them by name; ``context``: what the reader knows around).
    derive: Callable[[Mapping[str, Any], Any], Any] | None = None
    #: The derived default as the docs show it (``shadow-requests-{name}``).
    default_doc: str | None = None
    #: None when the key may be given here, else why not (``values`` read so far).
    allowed: Callable[[Mapping[str, Any]], str | None] | None = None
    #: What the value read becomes (a path resolved, a header lowercased).
    parse: Callable[[Any, Any], Any] | None = None
    #: The whole message when a required key is missing.
    required: str | None = None
    #: The whole message when the value has the wrong YAML type (else the types).
    expected: str | None = None
    #: The YAML type when it is not the field's (a list parsed into a value).
    yaml: type | None = None
    #: A value for the example configuration when the default is not one to show.
    example: Any = None


def key(
    doc: str,
    default: Any = attrs.NOTHING,
    *,
    factory: Callable[[], Any] | None = None,
    converter: Callable[[Any], Any] | None = None,
    **meta: Any,
) -> Any:
    """A configuration key: an attrs field with its ``Key``."""
    return attrs.field(
        default=attrs.Factory(factory) if factory is not None else default,
        converter=converter,
        metadata={KEY: Key(doc, **meta)},
    )


def keys(cls: type) -> list[attrs.Attribute]:
    """The fields of ``cls`` that are configuration keys, in declaration order."""
    attrs.resolve_types(cls)
    return [f for f in attrs.fields(cls) if KEY in f.metadata]


def meta(field: attrs.Attribute) -> Key:
    return field.metadata[KEY]


def optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (it, False)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def is_section(annotation: Any) -> bool:
    """A nested value class: a mapping of its own keys."""
    return isinstance(annotation, type) and attrs.has(annotation)


def is_list_of(annotation: Any) -> Any | None:
    """``tuple[X, ...]`` -> X (a YAML list); else None."""
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    return None


def is_choice(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, enum.StrEnum)


def yaml_kinds(annotation: Any, yaml: type | None = None) -> tuple[type, ...]:
    """The Python types a YAML value of this key may load as (a list may be null:
    empty)."""
    inner, nullable = optional(annotation)
    if yaml is not None:
        base: type = yaml
        nullable = nullable or yaml is list
    elif is_list_of(inner) is not None:
        base = list
        nullable = True
    elif is_choice(inner):
        base = str
    elif is_section(inner):
        base = Mapping
    else:
        base = inner
    return (base, type(None)) if nullable else (base,)


def type_doc(annotation: Any) -> str:
    """The type as the docs table says it."""
    inner, nullable = optional(annotation)
    item = is_list_of(inner)
    if item is not None:
        text = "list of " + ("mappings" if is_section(item) else _name(item) + "s")
    elif is_choice(inner):
        text = " \\| ".join(f"`{member.value}`" for member in inner)
    elif is_section(inner):
        text = "mapping"
    else:
        text = _name(inner)
    return f"{text} or null" if nullable else text


def _name(kind: Any) -> str:
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(
        kind, getattr(kind, "__name__", str(kind))
    )
