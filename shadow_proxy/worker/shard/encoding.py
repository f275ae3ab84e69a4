"""A record's bytes, with what can be recorded kept. Pure.

``records.wire.encode_envelope`` refuses a map MessagePack cannot hold. Two
causes come from clients and do not make the whole record worthless:

- a string holding a lone surrogate (``"\\ud800"`` in JSON is accepted by
  Python's parser; Dynamo 1.6.1 refuses such a body, so with Dynamo this only
  reaches a record for other frontends): each lone surrogate is replaced by
  U+FFFD and the envelope says ``sanitized: ["lone_surrogates"]``;
- an integer outside MessagePack's range (below -2**63 or from 2**64): the
  value is replaced by its decimal string, and ``sanitized`` says
  ``"big_integers"``.

Only when that fails too is the record dropped (``encode_error``). The walk is
iterative and bounded (``MAX_DEPTH``), like the projection's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadow_proxy.records.wire import WireError, encode_envelope

MAX_DEPTH = 128
_MIN_INT, _END_INT = -(2**63), 2**64


def encode_record(envelope: Mapping[str, Any]) -> bytes:
    """The envelope's MessagePack; see the module docstring. Raises ``WireError``."""
    try:
        return encode_envelope(envelope)
    except WireError:
        pass
    fixed, causes = _sanitized(envelope)
    if not causes:
        raise WireError("encode", "cannot encode envelope")
    fixed["sanitized"] = sorted(causes)
    return encode_envelope(fixed)


def _fix_str(value: str, causes: set[str]) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        causes.add("lone_surrogates")
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value


def _sanitized(value: Mapping[str, Any]) -> tuple[dict, set[str]]:
    causes: set[str] = set()
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(root, 0, value, 0)]
    while stack:
        parent, slot, item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise WireError("encode", f"record nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, Mapping):
            copy: Any = {}
            for name, child in item.items():
                key = _fix_str(name, causes) if isinstance(name, str) else name
                copy[key] = None
                stack.append((copy, key, child, depth + 1))
        elif isinstance(item, (list, tuple)):
            copy = [None] * len(item)
            stack.extend((copy, i, child, depth + 1) for i, child in enumerate(item))
        elif isinstance(item, str):
            copy = _fix_str(item, causes)
        elif type(item) is int and not _MIN_INT <= item < _END_INT:
            causes.add("big_integers")
            copy = str(item)
        else:
            copy = item
        parent[slot] = copy
    return root[0], causes
