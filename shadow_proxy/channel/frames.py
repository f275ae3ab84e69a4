"""The hand-off frames, serving loop -> tap worker (see docs/INTERNALS.md).

Pure functions and ``struct`` layouts; the sockets live in
``serving/handoff.py`` (sender) and ``worker/main.py`` (receiver). Every message
is a few frames; the first is a one-byte kind, the request's 8-byte key (a
counter of the serving process, never the client's id) and the kind's meta:

- ``q`` request: meta ``REQUEST_META``; frames: request id, body (the bytes
  the client sent), engine headers (``channel.headers``: the allow-listed
  request headers, ``name:value\n`` each), content-encoding (the request's
  header, ASCII; empty for none: the worker decodes its own copy, bounded).
- ``c`` chunks: frames: head, index, joined chunks.
- ``e`` end: meta ``END_META``; frames: head, detail, index, joined chunks.
- ``z`` last: the serving process closes the pipe; nothing follows.

``head`` is ``HEAD_META`` then ``content-type\\ncontent-encoding`` in the
first ``c`` or ``e`` message after the response started; empty otherwise.
"""

from __future__ import annotations

import struct

KIND_REQUEST = b"q"
KIND_CHUNK = b"c"
KIND_END = b"e"
KIND_LAST = b"z"

KEY = struct.Struct(">Q")
REQUEST_META = struct.Struct(">BQQQ")  # route, arrival_unix_ns, arrival_mono_ns, lost_before
HEAD_META = struct.Struct(">HQ")  # status, offset_ns; then content-type \n content-encoding
END_META = struct.Struct(">BQ")  # end kind, offset_ns
HEADER = 1 + KEY.size

#: The last message of a pipe (key 0).
LAST_MESSAGE = KIND_LAST + KEY.pack(0)


def split_header(frame: bytes) -> tuple[bytes, bytes, bytes]:
    """The kind, the key and the meta of a message's first frame."""
    return frame[:1], frame[1:HEADER], frame[HEADER:]


def pack_encoding(content_encoding: str) -> bytes:
    """The ``q`` message's content-encoding frame (the header value as sent)."""
    return content_encoding.encode("latin-1", "replace")


def unpack_encoding(frames: list[bytes]) -> str:
    """The content-encoding of a ``q`` message's frames ('' for none)."""
    return frames[4].decode("latin-1") if len(frames) > 4 else ""


def pack_head(status: int, offset_ns: int, content_type: str, content_encoding: str) -> bytes:
    """A head frame: the response's status, its offset and two header values."""
    text = f"{content_type}\n{content_encoding}".encode("latin-1", "replace")
    return HEAD_META.pack(status, offset_ns) + text


def unpack_head(frame: bytes) -> tuple[int, int, str, str] | None:
    """Status, offset, content-type and content-encoding from a head frame (or None)."""
    if not frame:
        return None
    status, offset = HEAD_META.unpack_from(frame)
    content_type, _, content_encoding = frame[HEAD_META.size :].decode("latin-1").partition("\n")
    return status, offset, content_type, content_encoding


def pack_chunks(offsets: list[int], chunks: list[bytes]) -> tuple[bytes, bytes]:
    """An index (n offsets as u64, then n lengths as u32) and the chunks joined."""
    n = len(chunks)
    index = struct.pack(f">{n}Q{n}I", *offsets, *map(len, chunks))
    return index, b"".join(chunks)


def unpack_chunks(index: bytes, data: bytes) -> list[tuple[bytes, int]]:
    """``(chunk, offset_ns)`` pairs from ``pack_chunks``'s two frames."""
    n = len(index) // 12
    values = struct.unpack(f">{n}Q{n}I", index)
    pairs, start = [], 0
    view = memoryview(data)
    for offset, length in zip(values[:n], values[n:], strict=True):
        pairs.append((bytes(view[start : start + length]), offset))
        start += length
    return pairs
