"""Messages between the tap worker's main and its shards (pure).

On a Unix stream socket per shard, framed as the hand-off is
(``channel.frames.stream_buffers``); the first frame starts with a kind byte.

Main -> shard: the hand-off messages of the requests routed to it, as the
serving loop sent them (``q``, ``c``, ``e``), and ``x`` (exit: nothing of
yours is open any more).

Shard -> main, in the order the shard produced them:

- ``H`` hello (token, pid): the first message; the token tells which spawn it is;
- ``Y`` ready (info map) or ``F`` failed (message): after loading the models;
- ``R`` record (tap, ready_mono_ns, seq offset; payload): an encoded envelope
  whose ``seq`` is the placeholder ``SEQ_PLACEHOLDER`` at ``offset`` (a fixed-width
  MessagePack uint64); the main takes the seq and writes it there;
- ``D`` drop (tap, count; reason): records lost before they existed (the main takes
  their seqs);
- ``S`` skip (tap; reason): a request the tap does not take;
- ``K`` settle (key, done; waiting taps): the records the request still owes, as
  tap indices (a tap once per record: a batch's prompts are a record each).
  Everything the shard sends for a request before ``K`` is about the records no
  longer waiting. ``done``: the shard has forgotten the request (until then its
  ``e`` is still wanted, for the prompt-token check);
- ``M`` metrics (families): the shard's metric snapshot;
- ``X`` retire (RSS in MiB): the shard is over ``worker.max_rss_mb``.
"""

from __future__ import annotations

import struct

import msgpack

from shadow_proxy.channel.control import Family

#: What a shard writes as ``seq``: msgpack encodes it as 0xcf + 8 bytes.
SEQ_PLACEHOLDER = 2**64 - 1
_SEQ_FIELD = b"\xa3seq\xcf" + b"\xff" * 8
_U64 = struct.Struct(">Q")

HELLO, READY, FAILED = b"H", b"Y", b"F"
RECORD, DROP, SKIP, SETTLE, METRICS, RETIRE = b"R", b"D", b"S", b"K", b"M", b"X"
EXIT = b"x"

_HELLO = struct.Struct(">QI")
_RECORD = struct.Struct(">HQi")
_DROP = struct.Struct(">HQ")
_SKIP = struct.Struct(">H")
_RETIRE = struct.Struct(">Q")


def seq_offset(payload: bytes) -> int:
    """Where the placeholder seq's 8 bytes are in an encoded envelope (-1: nowhere).
    The first ``seq`` key of the map is the envelope's: ``schema_version`` and the
    tap's name (``[A-Za-z0-9_-]``) come before it and cannot hold these bytes."""
    at = payload.find(_SEQ_FIELD)
    return -1 if at < 0 else at + len(_SEQ_FIELD) - 8


def with_seq(payload: bytes, offset: int, seq: int) -> bytes:
    return payload[:offset] + _U64.pack(seq) + payload[offset + 8 :]


def hello(token: int, pid: int) -> list[bytes]:
    return [HELLO + _HELLO.pack(token, pid)]


def ready(info: dict) -> list[bytes]:
    return [READY, msgpack.packb(info)]


def failed(message: str) -> list[bytes]:
    return [FAILED, message.encode("utf-8", "replace")]


def record(tap: int, ready_mono_ns: int, offset: int, payload: bytes) -> list[bytes]:
    return [RECORD + _RECORD.pack(tap, ready_mono_ns, offset), payload]


def drop(tap: int, reason: str, count: int = 1) -> list[bytes]:
    return [DROP + _DROP.pack(tap, count), reason.encode()]


def skip(tap: int, reason: str) -> list[bytes]:
    return [SKIP + _SKIP.pack(tap), reason.encode()]


def settle(key: bytes, waiting: list[int], done: bool) -> list[bytes]:
    flag = b"\x01" if done else b"\x00"
    return [SETTLE + key + flag, struct.pack(f">{len(waiting)}H", *waiting)]


def metrics(families: list[Family]) -> list[bytes]:
    return [METRICS, msgpack.packb(families)]


def retire(rss_mb: int) -> list[bytes]:
    return [RETIRE + _RETIRE.pack(rss_mb)]


def exit_message() -> list[bytes]:
    return [EXIT]


def parse_hello(frames: list[bytes]) -> tuple[int, int]:
    return _HELLO.unpack(frames[0][1:])


def parse_record(frames: list[bytes]) -> tuple[int, int, int, bytes]:
    return (*_RECORD.unpack(frames[0][1:]), frames[1])


def parse_drop(frames: list[bytes]) -> tuple[int, int, str]:
    tap, count = _DROP.unpack(frames[0][1:])
    return tap, count, frames[1].decode()


def parse_skip(frames: list[bytes]) -> tuple[int, str]:
    return _SKIP.unpack(frames[0][1:])[0], frames[1].decode()


def parse_settle(frames: list[bytes]) -> tuple[bytes, tuple[int, ...], bool]:
    waiting = struct.unpack(f">{len(frames[1]) // 2}H", frames[1])
    return frames[0][1:9], waiting, frames[0][9:10] == b"\x01"


def parse_info(frames: list[bytes]) -> dict:
    return msgpack.unpackb(frames[1])


def parse_metrics(frames: list[bytes]) -> list[Family]:
    return msgpack.unpackb(frames[1])


def parse_retire(frames: list[bytes]) -> int:
    return _RETIRE.unpack(frames[0][1:])[0]
