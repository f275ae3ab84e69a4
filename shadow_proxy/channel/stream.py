"""Messages on a byte stream: the framing of every pipe between the processes. Pure.

The hand-off (serving process -> worker main, a Unix stream socket) and the pipes
between the worker's main and its shards carry messages of a few frames each. On
the stream a message is a u32 total length, then each frame as a u32 length and
its bytes. What the frames mean is the protocol's own module
(``channel/handoff.py``, ``worker/messages.py``); this one only cuts the stream.

``stream_buffers`` gives a message as buffers for ``writelines``/``sendmsg`` (the
frames are not copied); ``StreamDecoder`` cuts what a ``recv`` returned into
whole messages (length prefix included, so a message can be forwarded as it is);
``split_frames`` and ``frame_at`` read a message's frames.
"""

from __future__ import annotations

import struct

U32 = struct.Struct(">I")
#: Offset of the first frame's first byte in a stream message.
FIRST_FRAME = 2 * U32.size
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


def stream_message(frames: list[bytes]) -> bytes:
    """One message as the bytes a ``StreamDecoder`` yields for it."""
    return b"".join(stream_buffers(frames)[0])


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
        if not buffer and type(data) is bytes:
            # Nothing held: the messages are cut from ``data`` itself (one that is
            # all of it is ``data``, not a copy); only an incomplete end is kept.
            messages, pos = _messages(data)
            if pos < len(data):
                self._buffer = bytearray(data[pos:])
            return messages
        buffer += data
        with memoryview(buffer) as view:
            messages, pos = _messages(view)
        if pos == len(buffer):
            self._buffer = bytearray()  # also gives back a large message's capacity
        elif pos:
            del buffer[:pos]
        return messages


def _messages(source: bytes | memoryview) -> tuple[list[bytes], int]:
    """The whole messages at the start of ``source``, each as bytes (a slice of
    bytes that is all of them is the same object), and where they end."""
    messages = []
    pos, size = 0, len(source)
    while size - pos >= U32.size:
        (total,) = U32.unpack_from(source, pos)
        end = pos + U32.size + total
        if end > size:
            break
        messages.append(bytes(source[pos:end]))
        pos = end
    return messages, pos
