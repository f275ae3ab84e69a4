"""The hand-off frames, serving loop -> tap worker (see docs/INTERNALS.md).

Pure functions and ``struct`` layouts; the sockets live in
``serving/handoff.py`` (sender) and ``worker/main.py`` (receiver). Every message
is a few frames; the first is a one-byte kind, the request's 8-byte key (a
counter of the serving process, never the client's id) and the kind's meta:

- ``h`` hello: the first message on every connection (key 0); frame: a
  MessagePack map (``channel/checkpoint.py``: what a dead predecessor left).
- ``q`` request: meta ``REQUEST_META``; frames: request id, body (the bytes
  the client sent), engine headers (``channel.headers``: the allow-listed
  request headers, ``name:value\n`` each), content-encoding (the request's
  header, ASCII; empty for none: the worker decodes its own copy, bounded).
- ``c`` chunks: frames: head, index, joined chunks.
- ``e`` end: meta ``END_META``; frames: head, detail, index, joined chunks.
- ``z`` last: the serving process closes the pipe; nothing follows.

``head`` is ``HEAD_META`` then ``content-type\\ncontent-encoding`` in the
first ``c`` or ``e`` message after the response started; empty otherwise. Its
offsets are from the request's arrival: when the response head came, and
when the serving loop sent the request to the frontend (0: it was not sent,
the proxy answered itself).

On a byte stream (the Unix socket of the hand-off, the pipes between the
worker's main and its shards) a message is a u32 total length, then each frame
as a u32 length and its bytes (``stream_buffers``, ``StreamDecoder``).
"""

from __future__ import annotations

import struct

KIND_REQUEST = b"q"
KIND_CHUNK = b"c"
KIND_END = b"e"
KIND_LAST = b"z"
KIND_HELLO = b"h"

KEY = struct.Struct(">Q")
REQUEST_META = struct.Struct(">BQQQ")  # route, arrival_unix_ns, arrival_mono_ns, lost_before
#: status, offset_ns, sent_offset_ns; then content-type \n content-encoding
HEAD_META = struct.Struct(">HQQ")
END_META = struct.Struct(">BQ")  # end kind, offset_ns
HEADER = 1 + KEY.size

#: The last message of a pipe (key 0).
LAST_MESSAGE = KIND_LAST + KEY.pack(0)

U32 = struct.Struct(">I")
#: Offset of the first frame's first byte (the kind) in a stream message.
KIND_OFFSET = 2 * U32.size
#: Largest message a stream carries (the u32 length prefix).
MAX_STREAM_MESSAGE = 2**32 - 1


def stream_buffers(frames: list[bytes]) -> tuple[list[bytes], int]:
    """One message as buffers for ``writelines``/``sendmsg`` (the frames are not
    copied) and its size on the stream."""
    buffers = [b""]
    total = 0
    for frame in frames:
        buffers.append(U32.pack(len(frame)))
        if frame:
            buffers.append(frame)
        total += U32.size + len(frame)
    buffers[0] = U32.pack(total)
    return buffers, total + U32.size


def consume(buffers: list, sent: int) -> None:
    """Remove the first ``sent`` bytes (a partial ``sendmsg``) from ``buffers``; the rest
    of a partly sent buffer is kept as a view (a large message is never copied again)."""
    while buffers and sent >= len(buffers[0]):
        sent -= len(buffers.pop(0))
    if sent:
        buffers[0] = memoryview(buffers[0])[sent:]


def split_frames(message: bytes | memoryview) -> list[bytes]:
    """The frames of one stream message (as ``StreamDecoder`` yields it, length included)."""
    frames = []
    pos, end = U32.size, len(message)
    while pos < end:
        (n,) = U32.unpack_from(message, pos)
        frames.append(bytes(message[pos + U32.size : pos + U32.size + n]))
        pos += U32.size + n
    return frames


class StreamDecoder:
    """Cuts a byte stream into messages. ``feed`` takes what a ``recv`` returned and
    returns the messages it completed, each as bytes with its length prefix (so it
    can be forwarded as it is, or split with ``split_frames``). Holds at most one
    incomplete message."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        messages = []
        pos, size = 0, len(buffer)
        with memoryview(buffer) as view:
            while size - pos >= U32.size:
                (total,) = U32.unpack_from(buffer, pos)
                end = pos + U32.size + total
                if end > size:
                    break
                messages.append(bytes(view[pos:end]))
                pos = end
        if pos == size:
            self._buffer = bytearray()  # also gives back a large message's capacity
        elif pos:
            del buffer[:pos]
        return messages


def peek(message: bytes) -> tuple[bytes, bytes]:
    """The kind and the key of a stream message, without splitting it."""
    return message[KIND_OFFSET : KIND_OFFSET + 1], message[KIND_OFFSET + 1 : KIND_OFFSET + HEADER]


def frame_at(message: bytes, index: int) -> bytes | None:
    """Frame ``index`` of a stream message, skipping the frames before it by
    their lengths (a request's body is never copied to read its headers); None
    when the message has fewer frames."""
    pos, end = U32.size, len(message)
    for _ in range(index):
        if pos + U32.size > end:
            return None
        (n,) = U32.unpack_from(message, pos)
        pos += U32.size + n
    if pos + U32.size > end:
        return None
    (n,) = U32.unpack_from(message, pos)
    return bytes(message[pos + U32.size : pos + U32.size + n])


def split_header(frame: bytes) -> tuple[bytes, bytes, bytes]:
    """The kind, the key and the meta of a message's first frame."""
    return frame[:1], frame[1:HEADER], frame[HEADER:]


def pack_encoding(content_encoding: str) -> bytes:
    """The ``q`` message's content-encoding frame (the header value as sent)."""
    return content_encoding.encode("latin-1", "replace")


def unpack_encoding(frames: list[bytes]) -> str:
    """The content-encoding of a ``q`` message's frames ('' for none)."""
    return frames[4].decode("latin-1") if len(frames) > 4 else ""


def pack_head(
    status: int, offset_ns: int, content_type: str, content_encoding: str, sent_offset_ns: int = 0
) -> bytes:
    """A head frame: the response's status, its offset, two header values and
    when the request was sent upstream (0: not sent)."""
    text = f"{content_type}\n{content_encoding}".encode("latin-1", "replace")
    return HEAD_META.pack(status, offset_ns, sent_offset_ns) + text


def unpack_head(frame: bytes) -> tuple[int, int, str, str, int] | None:
    """Status, offset, content-type, content-encoding and the upstream send's
    offset (0: not sent) from a head frame (or None)."""
    if not frame:
        return None
    status, offset, sent = HEAD_META.unpack_from(frame)
    content_type, _, content_encoding = frame[HEAD_META.size :].decode("latin-1").partition("\n")
    return status, offset, content_type, content_encoding, sent


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
