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
"""

from __future__ import annotations

import zlib

from shadow_proxy.worker.request.fields import Reject

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
