"""A record's bytes, with what can be recorded kept, its seq left to the sink. Pure.

``encode_record`` gives the envelope's MessagePack in two pieces around the value
of its ``seq`` (``worker.sink.EncodedRecord``): the sink that takes the seq joins
them, so the bytes are those of one ``packb`` of the envelope with that seq.

MessagePack refuses some maps. Two
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

import msgpack

from shadow_proxy.records.wire import WireError
from shadow_proxy.worker.request.incremental import TokenIds
from shadow_proxy.worker.sink import EncodedRecord

MAX_DEPTH = 128
_MIN_INT, _END_INT = -(2**63), 2**64


#: A list at least this long in the request map (the prompt's token ids) is packed
#: once per request: the other taps' records reuse its bytes.
SHARED_LIST = 256
#: Packed lists by ``id``, with the list itself (so that the id stays its own).
Packed = dict[int, tuple[list, bytes]]


def encode_record(envelope: Mapping[str, Any], packed: Packed | None = None) -> EncodedRecord:
    """The envelope's MessagePack without its seq's value (the envelope must have a
    ``seq`` key; its value is not read); see the module docstring. ``packed``:
    the request's long lists packed so far (one dict per request, kept by the
    caller), filled here. Raises ``WireError``."""
    if "seq" not in envelope:
        raise WireError("encode", "an envelope has a 'seq'")
    try:
        return _encode(envelope, packed)
    except WireError:
        pass
    fixed, causes = _sanitized(envelope)
    if not causes:
        raise WireError("encode", "cannot encode envelope")
    fixed["sanitized"] = sorted(causes)
    return _encode(fixed)


def _encode(envelope: Mapping[str, Any], packed: Packed | None = None) -> EncodedRecord:
    """As ``records.wire.encode_envelope`` encodes the map (bin for bytes, maps
    stay maps), packed item by item: the bytes before the ``seq`` value, and after.
    A map packed item by item is the bytes of one ``pack`` of it."""
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_map_header(len(envelope))]
    head = None
    try:
        for key, value in envelope.items():
            parts.append(packer.pack(key))
            if key == "seq" and head is None:
                head, parts = b"".join(parts), []
            elif key == "request" and packed is not None and type(value) is dict:
                parts.append(packer.pack_map_header(len(value)))
                for name, item in value.items():
                    parts.append(packer.pack(name))
                    parts.append(_pack_shared(packer, item, packed))
            else:
                parts.append(packer.pack(value))
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError("encode", f"cannot encode envelope: {exc}") from exc
    assert head is not None  # encode_record checked
    return EncodedRecord(head, b"".join(parts))


def _pack_shared(packer: msgpack.Packer, value: Any, packed: Packed) -> bytes:
    if type(value) is TokenIds:  # packed when encoded, most of it for an earlier turn
        return value.packed()
    if type(value) is not list or len(value) < SHARED_LIST:
        return packer.pack(value)
    hit = packed.get(id(value))
    if hit is None or hit[0] is not value:
        hit = packed[id(value)] = (value, packer.pack(value))
    return hit[1]


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
