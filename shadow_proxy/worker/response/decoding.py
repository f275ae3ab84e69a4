"""Content-Encoding of a response body, undone incrementally and in bounded steps.

The serving loop hands the worker the body exactly as the frontend sent it
(still encoded); the recorder reads it through a ``BodyDecoder``. Output comes
in pieces of at most ``DECODE_STEP`` bytes, so a small compressed chunk that
expands enormously never becomes one huge buffer.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

#: Largest piece of decompressed output handled at once (bounds a gzip bomb).
DECODE_STEP = 256 * 1024
#: The encodings ``for_header`` knows, as the header names them.
DECODABLE = ("gzip", "x-gzip", "deflate")


class DecodeError(ValueError):
    """A corrupt encoded body."""


def for_header(content_encoding: str) -> BodyDecoder | None:
    """The decoder for a ``Content-Encoding`` value; None when it cannot be decoded."""
    encodings = [e.strip().lower() for e in content_encoding.split(",")]
    encodings = [e for e in encodings if e and e != "identity"]
    if not encodings:
        return BodyDecoder("identity")
    if len(encodings) == 1 and encodings[0] in DECODABLE:
        return BodyDecoder("deflate" if encodings[0] == "deflate" else "gzip")
    return None


class BodyDecoder:
    """Incremental Content-Encoding decoder (gzip, deflate in zlib or raw form,
    identity). Output comes in pieces of at most ``DECODE_STEP`` bytes."""

    __slots__ = ("_head", "_obj", "kind")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._obj: Any = None
        self._head = b""
        if kind == "gzip":
            self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def decode(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of ``data``, produced one at a time (never all at
        once: a small compressed chunk may expand enormously); raises
        ``DecodeError`` on a corrupt stream."""
        try:
            yield from self._decode(data)
        except zlib.error as e:
            raise DecodeError(str(e)) from e

    def _decode(self, data: bytes) -> Iterator[bytes]:
        if self.kind == "identity":
            yield data
            return
        if self._obj is None:  # deflate: zlib-wrapped (RFC 9110) or raw, as sent
            data = self._head + data
            if len(data) < 2:
                self._head = data
                return
            self._head = b""
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._obj = zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
        while data:
            out = self._obj.decompress(data, DECODE_STEP)
            data = self._obj.unconsumed_tail
            if self._obj.eof:
                rest = self._obj.unused_data
                if rest and self.kind == "gzip":
                    self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)  # next gzip member
                    data = rest
                else:
                    data = b""
            if out:
                yield out
