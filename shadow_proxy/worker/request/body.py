"""The request body as the client encoded it -> the bytes to parse, bounded.

Pure module (no aiohttp, no zmq); runs in the tap worker. The serving loop
forwards the body byte for byte (a gzip body stays gzip, the frontend decodes
it) and hands the worker the same bytes with the request's
``Content-Encoding``; the worker decodes its own copy here, before parsing.

Bound: the decoded body may hold at most ``limit`` bytes (the configuration's
``upstream.max_request_bytes``, the bound the serving loop applies to the
bytes on the wire); decoding stops one byte past it, so a small gzip bomb
costs at most ``limit`` bytes of memory and the CPU to produce them.

Encodings decoded: ``gzip`` (and ``x-gzip``), ``deflate`` (zlib, or raw
deflate as some clients send it), ``identity``; a list (``gzip, deflate``)
is decoded last first. Anything else, or bytes that do not decode, is
``Reject("content_encoding")``; over the bound ``Reject("body_too_large")``.

``parse_body`` then reads the decoded bytes as the request object, as serde
would accept it (``Reject`` with ``non_utf8``, ``invalid_json`` or
``not_an_object`` otherwise).
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

import msgspec

from shadow_proxy.worker.request.fields import Reject, reject_constant

#: zlib ``wbits`` per encoding: gzip header, zlib header.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decode_body(body: bytes, content_encoding: str, limit: int) -> bytes:
    """``body`` with ``content_encoding`` undone, at most ``limit`` bytes."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        wbits = _WBITS.get(coding)
        if wbits is None:
            raise Reject("content_encoding")
        try:
            body = _inflate(body, wbits, limit)
        except zlib.error:
            if coding != "deflate":
                raise Reject("content_encoding") from None
            try:  # raw deflate, without the zlib header
                body = _inflate(body, -zlib.MAX_WBITS, limit)
            except zlib.error:
                raise Reject("content_encoding") from None
    if len(body) > limit:
        raise Reject("body_too_large")
    return body


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    """Every member of ``data`` (gzip allows several), stopping past ``limit``."""
    out = bytearray()
    while True:
        decoder = zlib.decompressobj(wbits)
        out += decoder.decompress(data, limit + 1 - len(out))
        if len(out) > limit:
            raise Reject("body_too_large")
        if not decoder.eof:  # the input ends inside the stream
            raise zlib.error("truncated")
        data = decoder.unused_data
        if not data:
            return bytes(out)


#: A JSON escape of a UTF-16 surrogate; only then is a body checked for lone ones.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(body: bytes, request: dict) -> bool:
    """Whether a string in the request (``body``, parsed) holds a lone surrogate
    (paired escapes become one character when parsed, lone ones stay). msgspec
    refuses a body with a lone surrogate escape, high or low: a body it reads
    has none (~15x cheaper than encoding the parsed request, which is done only
    when msgspec fails for another reason, such as a number out of its range)."""
    try:
        msgspec.json.decode(body)
    except msgspec.DecodeError:
        pass
    else:
        return False
    try:
        json.dumps(request, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def parse_body(body: bytes) -> dict:
    """The request object, or ``Reject`` (``non_utf8``, ``invalid_json``,
    ``not_an_object``). msgspec reads a body first: it gives what ``json.loads``
    gives (the same values and types, integers of any size exactly, floats
    correctly rounded, the last of duplicate keys) and refuses what serde would
    refuse here (invalid UTF-8, lone surrogates, ``NaN``), or a number it cannot
    hold (``1e400``); a body it refuses is read by ``json.loads``, which says
    why, or reads the numbers msgspec cannot (``1e400`` as ``inf``, as serde
    does not: kept as it was)."""
    try:
        request = msgspec.json.decode(body)
    except msgspec.DecodeError:
        request = _parse_general(body)
    if not isinstance(request, dict):
        raise Reject("not_an_object")
    return request


def _parse_general(body: bytes) -> Any:
    """``parse_body`` of a body msgspec refused: ``json.loads`` says why."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Reject("non_utf8") from None
    try:
        request = json.loads(text, parse_constant=reject_constant)
    except ValueError:
        raise Reject("invalid_json") from None
    lone = isinstance(request, dict) and _SURROGATE_ESCAPE.search(body) is not None
    if lone and _has_lone_surrogate(body, request):
        raise Reject("invalid_json")  # serde refuses them: the frontend answers 400
    return request
