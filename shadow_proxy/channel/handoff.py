"""The hand-off protocol, serving loop -> tap worker: its messages. Pure.

The serving process sends (``serving/handoff.py``), the worker's main routes each
message to a shard without decoding it (``peek``, ``Request.routing``), the shard
decodes it (``decode``) and ``match``es on its class (``worker/shard/loop.py``).
On the stream each message is a few frames (``channel/stream.py``); the first
starts with a one-byte ``Kind``, the request's 8-byte key (a counter of the
serving process, never the client's id) and the kind's fixed meta:

- ``Hello``: first on every connection (key 0): what dead predecessors left to
  announce and count (``channel/checkpoint.py``);
- ``Request``: the body has been read;
- ``Chunks``: every 32 chunks or 64 KiB written to the client (joined taps only);
- ``End``: the exchange ended, whichever way, with the chunks not sent yet;
- ``Last``: the serving process closes the pipe; nothing follows.

Cheap to send: a request is two messages (``Request``, ``End``) of a few
``struct``-packed frames; the bytes the client sent and the response's chunks
are referenced, never copied, until the one ``writev`` of the loop iteration.
No JSON and no MessagePack on the serving loop: only ``Hello``, sent once per
connection, is MessagePack. The messages the serving loop makes per request are
``attrs.define`` classes, not frozen ones (a frozen class's ``__init__`` costs
three times as much); nothing changes them after they are made.
"""

from __future__ import annotations

import enum
import struct

import attrs
import msgpack

from shadow_proxy.channel import checkpoint as cp
from shadow_proxy.channel.stream import FIRST_FRAME, frame_at
from shadow_proxy.exchange import EndKind, Route


class Kind(bytes, enum.Enum):
    """The first byte of a message."""

    HELLO = b"h"
    REQUEST = b"q"
    CHUNKS = b"c"
    END = b"e"
    LAST = b"z"


#: The kinds' bytes (an enum member's ``.value`` is a lookup the serving loop skips).
_HELLO, _REQUEST_KIND, _CHUNKS, _END_KIND, _LAST = (k.value for k in Kind)
KEY = struct.Struct(">Q")
#: Kind and key: the start of every message's first frame.
HEADER = 1 + KEY.size
#: The key of the messages that are not about a request.
NO_KEY = KEY.pack(0)
_REQUEST = struct.Struct(">BQQQ")  # route, arrival_unix_ns, arrival_mono_ns, lost_before
#: status, offset_ns, sent_offset_ns; then content-type \n content-encoding
_HEAD = struct.Struct(">HQQ")
_END = struct.Struct(">BQ")  # end kind, offset_ns
#: A request message's frames: meta, request id, body, engine headers, content-encoding.
_HEADERS_FRAME = 3


class HandoffError(ValueError):
    """Frames that are not a hand-off message (a bug of the sender)."""


@attrs.frozen
class Hello:
    """What the worker must know when it connects: its incarnation, the hand-off
    losses a dead predecessor already counted, and the final state of each dead
    publisher, which it announces on that publisher's id."""

    generation: int
    #: Requests the serving loop could not hand over before this connection, as
    #: counted by the dead predecessors (``Request.lost_before`` counts on from it).
    lost_base: int
    tombstones: tuple[cp.TapState, ...] = ()

    def encode(self) -> list[bytes]:
        states = [attrs.astuple(t, recurse=False) for t in self.tombstones]
        body = msgpack.packb([self.generation, self.lost_base, states])
        return [_HELLO + NO_KEY, body]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Hello:
        generation, lost_base, states = msgpack.unpackb(frames[1], strict_map_key=False)
        return cls(generation, lost_base, tuple(cp.TapState(*s) for s in states))


@attrs.define
class Request:
    """A request whose body has been read: what the worker rebuilds it from."""

    key: bytes
    route: Route
    #: Wall clock, read once at arrival; and the monotonic stamp offsets count from
    #: (CLOCK_MONOTONIC is system-wide: the worker subtracts it from its own clock).
    arrival_unix_ns: int
    arrival_mono_ns: int
    #: Requests the serving loop could not hand over so far, since it started: each
    #: tap loses every one of them once (``handoff_full``), counted by the main.
    lost_before: int
    request_id: str
    #: The bytes the client sent, still content-encoded (the worker decodes its copy).
    body: bytes
    #: The allow-listed request headers, ``channel.headers.pick``'s frame.
    engine_headers: bytes = b""
    #: The body's Content-Encoding header as sent ('' for none).
    content_encoding: str = ""

    def encode(self) -> list[bytes]:
        meta = _REQUEST.pack(
            self.route, self.arrival_unix_ns, self.arrival_mono_ns, self.lost_before
        )
        return [
            _REQUEST_KIND + self.key + meta,
            self.request_id.encode(),
            self.body,
            self.engine_headers,
            self.content_encoding.encode("latin-1", "replace"),
        ]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Request:
        first = frames[0]
        try:
            route, unix_ns, mono_ns, lost_before = _REQUEST.unpack(first[HEADER:])
            route = Route(route)
        except (struct.error, ValueError) as e:
            msg = "a request message with a malformed header"
            raise HandoffError(msg) from e
        return cls(
            key=first[1:HEADER],
            route=route,
            arrival_unix_ns=unix_ns,
            arrival_mono_ns=mono_ns,
            lost_before=lost_before,
            request_id=frames[1].decode("utf-8", "replace") if len(frames) > 1 else "",
            body=frames[2] if len(frames) > 2 else b"",
            engine_headers=frames[3] if len(frames) > 3 else b"",
            content_encoding=frames[4].decode("latin-1") if len(frames) > 4 else "",
        )

    @staticmethod
    def routing(message: bytes) -> tuple[int, int, bytes | None]:
        """From a request's stream message, without copying its body: its
        monotonic arrival stamp, its ``lost_before`` and its engine headers frame
        (what the main routes it by)."""
        _, _, mono_ns, lost_before = _REQUEST.unpack_from(message, FIRST_FRAME + HEADER)
        return mono_ns, lost_before, frame_at(message, _HEADERS_FRAME)


@attrs.define
class Head:
    """The response's start: its status, when its headers arrived, two header values,
    and when the serving loop sent the request to the frontend. Offsets are from
    the request's arrival; ``sent_offset_ns`` is 0 where the request was not sent
    (the proxy answered itself)."""

    status: int
    offset_ns: int
    content_type: str
    content_encoding: str
    sent_offset_ns: int = 0

    def encode(self) -> bytes:
        text = f"{self.content_type}\n{self.content_encoding}".encode("latin-1", "replace")
        return _HEAD.pack(self.status, self.offset_ns, self.sent_offset_ns) + text

    @classmethod
    def decode(cls, frame: bytes) -> Head | None:
        if not frame:
            return None
        status, offset, sent = _HEAD.unpack_from(frame)
        content_type, _, encoding = frame[_HEAD.size :].decode("latin-1").partition("\n")
        return cls(status, offset, content_type, encoding, sent)


@attrs.define
class Pieces:
    """Body chunks as one message carries them: their bytes joined, and each one's
    length. The worker reads whole events straight from ``joined``
    (``SSEParser.whole_events``) and splits it into chunks only when it must read
    them one by one (``split``)."""

    joined: bytes = b""
    lengths: list[int] = attrs.field(factory=list)

    @classmethod
    def of(cls, chunks: list[bytes]) -> Pieces:
        return cls(b"".join(chunks), list(map(len, chunks)))

    def __len__(self) -> int:
        return len(self.lengths)

    def split(self) -> list[bytes]:
        """The chunks, each as its own bytes."""
        joined, out, start = self.joined, [], 0
        for length in self.lengths:
            out.append(joined[start : start + length])
            start += length
        return out


def _pack_chunks(offsets: list[int], data: Pieces) -> tuple[bytes, bytes]:
    """An index (n offsets as u64, then n lengths as u32) and the chunks joined."""
    n = len(data.lengths)
    return struct.pack(f">{n}Q{n}I", *offsets, *data.lengths), data.joined


def _unpack_chunks(index: bytes, joined: bytes) -> tuple[list[int], Pieces]:
    n = len(index) // 12
    values = struct.unpack(f">{n}Q{n}I", index)
    lengths = list(values[n:])
    if sum(lengths) != len(joined):
        msg = "chunk lengths that do not add up to the chunks' bytes"
        raise HandoffError(msg)
    return list(values[:n]), Pieces(joined, lengths)


@attrs.define
class Chunks:
    """Body chunks as the client was sent them, each with its monotonic offset
    from arrival; the response's ``head`` in the first message after it started."""

    key: bytes
    head: Head | None
    offsets: list[int]
    data: Pieces

    def encode(self) -> list[bytes]:
        index, joined = _pack_chunks(self.offsets, self.data)
        head = self.head.encode() if self.head is not None else b""
        return [_CHUNKS + self.key, head, index, joined]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Chunks:
        offsets, data = _unpack_chunks(frames[2], frames[3])
        return cls(frames[0][1:HEADER], Head.decode(frames[1]), offsets, data)


@attrs.define
class End:
    """The exchange is over: how it ended (``EndKind``), when, and the chunks not
    sent yet (without joined taps: the last two, where ``usage`` is)."""

    key: bytes
    end: EndKind
    offset_ns: int
    head: Head | None = None
    #: From a fixed vocabulary (``serving/proxy.py``), never client text.
    detail: str = ""
    offsets: list[int] = attrs.field(factory=list)
    data: Pieces = attrs.field(factory=Pieces)

    @classmethod
    def lost(cls, key: bytes, offset_ns: int) -> End:
        """The end of a request part of which could not be handed over: the
        worker builds no record from a partial copy."""
        return cls(key, EndKind.CAPTURE_LOST, offset_ns)

    def encode(self) -> list[bytes]:
        index, joined = _pack_chunks(self.offsets, self.data)
        head = self.head.encode() if self.head is not None else b""
        meta = _END.pack(self.end, self.offset_ns)
        return [_END_KIND + self.key + meta, head, self.detail.encode(), index, joined]

    @classmethod
    def decode(cls, frames: list[bytes]) -> End:
        first = frames[0]
        end, offset = _END.unpack(first[HEADER:])
        offsets, data = _unpack_chunks(frames[3], frames[4])
        return cls(
            first[1:HEADER],
            EndKind(end),
            offset,
            Head.decode(frames[1]),
            frames[2].decode("ascii", "replace"),
            offsets,
            data,
        )


@attrs.frozen
class Last:
    """Nothing follows on this pipe: the worker has read everything."""

    def encode(self) -> list[bytes]:
        return [_LAST + NO_KEY]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Last:
        return cls()


HandoffMessage = Hello | Request | Chunks | End | Last

_CLASSES: dict[bytes, type[Hello] | type[Request] | type[Chunks] | type[End] | type[Last]] = {
    Kind.HELLO.value: Hello,
    Kind.REQUEST.value: Request,
    Kind.CHUNKS.value: Chunks,
    Kind.END.value: End,
    Kind.LAST.value: Last,
}


def decode(frames: list[bytes]) -> HandoffMessage:
    """The message in ``frames``; ``HandoffError`` when it is not one."""
    cls = _CLASSES.get(frames[0][:1]) if frames and frames[0] else None
    if cls is None:
        msg = "not a hand-off message"
        raise HandoffError(msg)
    try:
        return cls.decode(frames)
    except (IndexError, struct.error, ValueError, TypeError, msgpack.UnpackException) as e:
        if isinstance(e, HandoffError):
            raise
        msg = f"a malformed {cls.__name__} message ({type(e).__name__})"
        raise HandoffError(msg) from e


def peek(message: bytes) -> tuple[bytes, bytes]:
    """The kind byte and the key of a stream message, without splitting it (compare
    the kind with ``Kind.X.value``)."""
    return message[FIRST_FRAME : FIRST_FRAME + 1], message[FIRST_FRAME + 1 : FIRST_FRAME + HEADER]
