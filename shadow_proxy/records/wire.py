"""Frames <-> records: the ZeroMQ framing and the MessagePack codec (SPEC section 4).

Pure functions, no socket. A tap's PUB socket sends one multipart message per
record, framed as Dynamo's ZeroMQ event plane frames its events, so a Dynamo
subscriber reads our records and our consumer reads Dynamo's tap:

    frame 0  topic, utf-8
    frame 1  publisher id, u64 big-endian
    frame 2  transport sequence, u64 big-endian (per socket, from 0)
    frame 3  5-byte header (version byte 1, payload length u32 big-endian),
             then a MessagePack map {publisher_id, sequence, published_at, topic,
             payload}, keys in that order (Dynamo's ``to_vec_named`` order);
             ``published_at`` is milliseconds since the epoch and ``payload`` is
             the encoded envelope as MessagePack bin.

Frames 1 and 2 repeat the map's ``publisher_id`` and ``sequence`` (Dynamo reads
them for deduplication without decoding the map); a decoder here insists that
they agree, and that the topic frame equals the map's ``topic``.

Heartbeats (``{topic}.heartbeat``) use the same framing on the same socket, but
their frame-2 sequence counts heartbeats, in a space of its own: a heartbeat
never takes a record transport sequence, so the record sequence stays dense and a
transport gap is exactly a lost record (a Dynamo consumer, which skips what it
cannot decode, would otherwise report a transport gap every second). The
heartbeat's payload carries the last record transport sequence instead.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import msgpack

FRAME_VERSION = 1
HEADER = struct.Struct(">BI")
U64 = struct.Struct(">Q")
U64_MAX = 2**64 - 1
MAX_PAYLOAD_BYTES = 2**32 - 1
HEARTBEAT_SUFFIX = ".heartbeat"

#: Dynamo keeps publisher ids exactly representable as a JSON (float64) number.
MAX_PUBLISHER_ID = 2**53 - 1

_MESSAGE_KEYS = ("publisher_id", "sequence", "published_at", "topic", "payload")


class WireError(ValueError):
    """A message or payload that does not follow the wire format.

    ``reason`` is one of a fixed vocabulary (``frames``, ``header``, ``length``,
    ``message``, ``topic``, ``encode``, ``envelope``, ``heartbeat``), safe to use
    as a counter key or a metric label; the message text says what was wrong.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@attrs.frozen
class Message:
    """One decoded multipart message: the transport fields and the raw payload."""

    topic: str
    publisher_id: int
    sequence: int
    published_at_ms: int
    payload: bytes


def new_publisher_id() -> int:
    """A random publisher id in 1 .. 2**53-1, as Dynamo draws them."""
    return secrets.randbelow(MAX_PUBLISHER_ID) + 1


def heartbeat_topic(topic: str) -> str:
    """The topic a tap's heartbeats are sent on."""
    return topic + HEARTBEAT_SUFFIX


def _check_u64(name: str, value: object) -> int:
    if type(value) is not int or not 0 <= value <= U64_MAX:
        msg = f"'{name}' must be an integer in 0 .. 2**64-1 (got {value!r})"
        raise WireError("message", msg)
    return value


def encode_frames(
    topic: str, publisher_id: int, sequence: int, published_at_ms: int, payload: bytes
) -> list[bytes]:
    """The four frames of one message. Raises ``WireError`` on out-of-range values."""
    for name, value in (
        ("publisher_id", publisher_id),
        ("sequence", sequence),
        ("published_at", published_at_ms),
    ):
        _check_u64(name, value)
    body = msgpack.packb(
        {
            "publisher_id": publisher_id,
            "sequence": sequence,
            "published_at": published_at_ms,
            "topic": topic,
            "payload": bytes(payload),
        },
        use_bin_type=True,
    )
    if len(body) > MAX_PAYLOAD_BYTES:
        msg = f"payload of {len(body)} bytes does not fit a u32 length"
        raise WireError("length", msg)
    return [
        topic.encode("utf-8"),
        U64.pack(publisher_id),
        U64.pack(sequence),
        HEADER.pack(FRAME_VERSION, len(body)) + body,
    ]


def _u64_frame(name: str, frame: bytes) -> int:
    if len(frame) != U64.size:
        msg = f"{name} frame must be {U64.size} bytes (got {len(frame)})"
        raise WireError("frames", msg)
    return U64.unpack(frame)[0]


def decode_frames(frames: Sequence[bytes]) -> Message:
    """Decode and cross-check one multipart message; ``WireError`` if malformed."""
    if len(frames) != 4:
        msg = f"expected 4 frames (topic, publisher id, sequence, body), got {len(frames)}"
        raise WireError("frames", msg)
    topic_frame, publisher_frame, sequence_frame, body = (bytes(f) for f in frames)
    try:
        topic = topic_frame.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError("topic", "topic frame is not utf-8") from exc
    publisher_id = _u64_frame("publisher id", publisher_frame)
    sequence = _u64_frame("sequence", sequence_frame)

    if len(body) < HEADER.size:
        msg = f"body of {len(body)} bytes is shorter than the {HEADER.size}-byte header"
        raise WireError("header", msg)
    version, length = HEADER.unpack_from(body)
    if version != FRAME_VERSION:
        msg = f"header version must be {FRAME_VERSION} (got {version})"
        raise WireError("header", msg)
    if length != len(body) - HEADER.size:
        msg = f"header says {length} payload bytes, frame has {len(body) - HEADER.size}"
        raise WireError("length", msg)

    try:
        inner = msgpack.unpackb(body[HEADER.size :], raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError("message", f"not MessagePack ({type(exc).__name__})") from exc
    if not isinstance(inner, dict):
        msg = f"message must be a map (got {type(inner).__name__})"
        raise WireError("message", msg)
    missing = [key for key in _MESSAGE_KEYS if key not in inner]
    if missing:
        raise WireError("message", f"message lacks {', '.join(missing)}")
    inner_publisher = _check_u64("publisher_id", inner["publisher_id"])
    inner_sequence = _check_u64("sequence", inner["sequence"])
    published_at = _check_u64("published_at", inner["published_at"])
    inner_topic = inner["topic"]
    payload = inner["payload"]
    if not isinstance(inner_topic, str):
        raise WireError("message", f"'topic' must be a string (got {inner_topic!r:.40})")
    if not isinstance(payload, bytes):
        msg = f"'payload' must be bin (got {type(payload).__name__})"
        raise WireError("message", msg)
    if inner_topic != topic:
        raise WireError("topic", f"topic frame {topic!r} differs from message topic")
    if inner_publisher != publisher_id or inner_sequence != sequence:
        msg = "publisher id or sequence frame differs from the message"
        raise WireError("message", msg)
    return Message(topic, publisher_id, sequence, published_at, payload)


def encode_envelope(envelope: Mapping[str, Any]) -> bytes:
    """MessagePack of a record (or any map): bin for bytes, maps stay maps."""
    if not isinstance(envelope, Mapping):
        msg = f"an envelope must be a map (got {type(envelope).__name__})"
        raise WireError("encode", msg)
    try:
        return msgpack.packb(envelope, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError("encode", f"cannot encode envelope: {exc}") from exc


def decode_envelope(data: bytes) -> dict[str, Any]:
    """The map a payload holds; ``WireError('envelope')`` if it is not one."""
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        msg = f"payload is not MessagePack ({type(exc).__name__})"
        raise WireError("envelope", msg) from exc
    if not isinstance(value, dict):
        msg = f"payload must be a map (got {type(value).__name__})"
        raise WireError("envelope", msg)
    return value


@attrs.frozen
class Heartbeat:
    """What a tap says about itself every second, on ``{topic}.heartbeat``.

    ``next_seq``: the ``seq`` the next record will take (every lower value was
    assigned). ``last_transport_sequence``: the transport sequence of the last
    record sent, ``None`` (nil) before the first. Counters are totals since the
    publisher started; ``dropped`` maps a drop reason to a count.
    """

    tap: str
    publisher_id: int
    next_seq: int
    last_transport_sequence: int | None
    queued: int = 0
    published: int = 0
    dropped: Mapping[str, int] = attrs.field(factory=dict)
    publish_errors: int = 0

    def encode(self) -> bytes:
        return encode_envelope(
            {
                "tap": self.tap,
                "publisher_id": self.publisher_id,
                "next_seq": self.next_seq,
                "last_transport_sequence": self.last_transport_sequence,
                "queued": self.queued,
                "published": self.published,
                "dropped": dict(self.dropped),
                "publish_errors": self.publish_errors,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> Heartbeat:
        """Parse a heartbeat payload; ``WireError('heartbeat')`` if malformed."""
        try:
            value = decode_envelope(data)
        except WireError as exc:
            raise WireError("heartbeat", str(exc)) from exc

        def u64(key: str) -> int:
            item = value.get(key)
            if type(item) is not int or not 0 <= item <= U64_MAX:
                msg = f"'{key}' must be a non-negative integer (got {item!r:.40})"
                raise WireError("heartbeat", msg)
            return item

        tap = value.get("tap")
        if not isinstance(tap, str):
            raise WireError("heartbeat", f"'tap' must be a string (got {tap!r:.40})")
        last = value.get("last_transport_sequence")
        dropped = value.get("dropped", {})
        if not isinstance(dropped, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in dropped.items()
        ):
            raise WireError("heartbeat", "'dropped' must map reasons to counts")
        return cls(
            tap=tap,
            publisher_id=u64("publisher_id"),
            next_seq=u64("next_seq"),
            last_transport_sequence=None if last is None else u64("last_transport_sequence"),
            queued=u64("queued"),
            published=u64("published"),
            dropped=dropped,
            publish_errors=u64("publish_errors"),
        )
