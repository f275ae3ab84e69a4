"""Content-Encoding of a response body, undone incrementally and in bounded steps.

The serving loop hands the worker the body exactly as the frontend sent it
(still encoded); the recorder reads it through a ``BodyDecoder``. Output comes
in pieces of at most ``DECODE_STEP`` bytes, so a small compressed chunk that
expands enormously never becomes one huge buffer.

Encodings: gzip (several members too), deflate (zlib-wrapped or raw), br
(``brotli``: its output buffer limit), zstd (``zstandard``, frames one after
another). The ``zstandard`` decompressor has no output limit per call, so it
is fed ``ZSTD_FEED`` bytes at a time: a zstd block holds at most 128 KiB and
takes at least 4 bytes, so one call yields at most (ZSTD_FEED / 4 + 1) blocks
(640 KiB), then cut into ``DECODE_STEP`` pieces.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import brotli
import zstandard

#: Largest piece of decompressed output handled at once (bounds a gzip bomb).
DECODE_STEP = 256 * 1024
#: The encodings ``for_header`` knows, as the header names them.
DECODABLE = ("gzip", "x-gzip", "deflate", "br", "zstd")
#: Compressed bytes handed to the zstd decompressor per call (see above).
ZSTD_FEED = 16


class DecodeError(ValueError):
    """A corrupt encoded body."""


def for_header(content_encoding: str) -> BodyDecoder | None:
    """The decoder for a ``Content-Encoding`` value; None when it cannot be decoded."""
    encodings = [e.strip().lower() for e in content_encoding.split(",")]
    encodings = [e for e in encodings if e and e != "identity"]
    if not encodings:
        return BodyDecoder("identity")
    if len(encodings) == 1 and encodings[0] in DECODABLE:
        return BodyDecoder("gzip" if encodings[0] == "x-gzip" else encodings[0])
    return None


class BodyDecoder:
    """Incremental Content-Encoding decoder (gzip, deflate in zlib or raw form,
    br, zstd, identity). Output comes in pieces of at most ``DECODE_STEP`` bytes."""

    __slots__ = ("_head", "_obj", "kind")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._obj: Any = None
        self._head = b""
        if kind == "gzip":
            self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif kind == "br":
            self._obj = brotli.Decompressor()
        elif kind == "zstd":
            self._obj = zstandard.ZstdDecompressor().decompressobj()

    def decode(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of ``data``, produced one at a time (never all at
        once: a small compressed chunk may expand enormously); raises
        ``DecodeError`` on a corrupt stream."""
        try:
            if self.kind == "br":
                yield from self._brotli(data)
            elif self.kind == "zstd":
                yield from self._zstd(data)
            else:
                yield from self._decode(data)
        except (zlib.error, brotli.error, zstandard.ZstdError) as e:
            raise DecodeError(str(e)) from e

    def _brotli(self, data: bytes) -> Iterator[bytes]:
        obj = self._obj
        if obj.is_finished():
            if data:
                raise DecodeError("data after the end of the brotli stream")
            return
        # The limit stops the buffer growing once reached (it may end up to
        # about twice DECODE_STEP); the pieces handed on are cut to DECODE_STEP.
        # Output may still be pending when the decoder already accepts more
        # input: drain until a call yields nothing.
        out = obj.process(data, output_buffer_limit=DECODE_STEP)
        while out or not obj.can_accept_more_data():
            for at in range(0, len(out), DECODE_STEP):
                yield out[at : at + DECODE_STEP]
            out = obj.process(b"", output_buffer_limit=DECODE_STEP)

    def _zstd(self, data: bytes) -> Iterator[bytes]:
        view = memoryview(data)
        for start in range(0, len(view), ZSTD_FEED):
            piece: bytes | memoryview = view[start : start + ZSTD_FEED]
            while piece:
                out = self._obj.decompress(piece)
                piece = b""
                if self._obj.eof:  # the next frame, if the body has one
                    piece = self._obj.unused_data
                    self._obj = zstandard.ZstdDecompressor().decompressobj()
                for at in range(0, len(out), DECODE_STEP):
                    yield out[at : at + DECODE_STEP]

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
