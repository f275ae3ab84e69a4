"""The protocol between the tap worker's main and its shards: its messages. Pure.

On a Unix stream socket per shard, framed as the hand-off is (``channel/stream.py``);
the first frame starts with a one-byte kind. The receiving side ``decode``s and
``match``es on the class (``worker/main/pool.py``, ``worker/shard/loop.py``).

Main -> shard: the hand-off messages of the requests routed to it, forwarded as
the serving loop sent them (``channel/handoff.py``), and ``Exit`` (nothing of
yours is open any more: finish and go).

Shard -> main, in the order the shard produced them:

- ``Hello``: the first message; its token says which spawn it is;
- ``Ready`` or ``Failed``: after loading the models;
- ``Record``, ``Drop``, ``Skip``: what the shard's joiner published into its
  sink (``worker/shard/outbox.py``): the main, the one owner of the taps' seqs,
  takes them (``worker/main/publishing.py``);
- ``Settle``: after each hand-off message, the records the request still owes.
  Everything the shard sends for a request before it is about the records no
  longer waiting;
- ``Metrics``: the shard's metric families, absolute (the main keeps the
  latest of each shard, ``channel/families.py``);
- ``Retire``: the shard is over ``worker.max_rss_mb``.
"""

from __future__ import annotations

import enum
import struct

import attrs
import msgpack

from shadow_proxy.channel import handoff
from shadow_proxy.channel.families import Family
from shadow_proxy.exchange import DropReason
from shadow_proxy.worker.sink import EncodedRecord


class Kind(bytes, enum.Enum):
    """The first byte of a message between the main and a shard."""

    EXIT = b"x"
    HELLO = b"H"
    READY = b"Y"
    FAILED = b"F"
    RECORD = b"R"
    DROP = b"D"
    SKIP = b"S"
    SETTLE = b"K"
    METRICS = b"M"
    RETIRE = b"X"


_HELLO = struct.Struct(">QI")
_RECORD = struct.Struct(">HQ")
_DROP = struct.Struct(">HQ")
_SKIP = struct.Struct(">H")
_RETIRE = struct.Struct(">Q")


class MessageError(ValueError):
    """Frames that are not a message of this protocol (a bug of the sender)."""


@attrs.frozen
class Exit:
    """Main -> shard: finish what you were sent (open requests as ``shutdown``
    records) and exit."""

    def encode(self) -> list[bytes]:
        return [Kind.EXIT.value]


@attrs.frozen
class Hello:
    """Which spawn this connection is (the main's token), and its pid."""

    token: int
    pid: int

    def encode(self) -> list[bytes]:
        return [Kind.HELLO.value + _HELLO.pack(self.token, self.pid)]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Hello:
        return cls(*_HELLO.unpack(frames[0][1:]))


@attrs.frozen
class Ready:
    """The shard loaded its models and runs in its scheduling class."""

    pid: int
    #: ``idle`` (SCHED_IDLE) or ``nice``; and why not idle, when it fell back.
    policy: str
    fallback: str | None = None
    #: The allocator it runs on (``allocator.in_use``).
    malloc: str = "system"

    def encode(self) -> list[bytes]:
        fields = [self.pid, self.policy, self.fallback, self.malloc]
        return [Kind.READY.value, msgpack.packb(fields)]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Ready:
        return cls(*msgpack.unpackb(frames[1]))


@attrs.frozen
class Failed:
    """The shard cannot start (a tokenizer that does not load): why."""

    message: str

    def encode(self) -> list[bytes]:
        return [Kind.FAILED.value, self.message.encode("utf-8", "replace")]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Failed:
        return cls(frames[1].decode("utf-8", "replace"))


@attrs.frozen
class Record:
    """A tap's record, ready at ``ready_mono_ns``, waiting for its seq."""

    tap: int
    ready_mono_ns: int
    record: EncodedRecord

    def encode(self) -> list[bytes]:
        meta = _RECORD.pack(self.tap, self.ready_mono_ns)
        return [Kind.RECORD.value + meta, self.record.head, self.record.tail]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Record:
        tap, ready = _RECORD.unpack(frames[0][1:])
        return cls(tap, ready, EncodedRecord(frames[1], frames[2]))


@attrs.frozen
class Drop:
    """Records of a tap lost before they existed (the main takes their seqs)."""

    tap: int
    reason: DropReason
    count: int = 1

    def encode(self) -> list[bytes]:
        return [Kind.DROP.value + _DROP.pack(self.tap, self.count), self.reason.encode()]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Drop:
        tap, count = _DROP.unpack(frames[0][1:])
        return cls(tap, DropReason(frames[1].decode()), count)


@attrs.frozen
class Skip:
    """A request a tap does not take: not a loss, no seq."""

    tap: int
    reason: str

    def encode(self) -> list[bytes]:
        return [Kind.SKIP.value + _SKIP.pack(self.tap), self.reason.encode()]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Skip:
        return cls(_SKIP.unpack(frames[0][1:])[0], frames[1].decode())


@attrs.frozen
class Settle:
    """The records request ``key`` still owes, as tap indices (a tap once per
    record: a batch's prompts are a record each). ``done``: the shard has
    forgotten the request (until then its end is still wanted, for the
    prompt-token check)."""

    key: bytes
    waiting: tuple[int, ...]
    done: bool

    def encode(self) -> list[bytes]:
        flag = b"\x01" if self.done else b"\x00"
        waiting = struct.pack(f">{len(self.waiting)}H", *self.waiting)
        return [Kind.SETTLE.value + self.key + flag, waiting]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Settle:
        first = frames[0]
        waiting = struct.unpack(f">{len(frames[1]) // 2}H", frames[1])
        return cls(first[1 : handoff.HEADER], waiting, first[handoff.HEADER :] == b"\x01")


@attrs.frozen
class Metrics:
    """The shard's metric families as plain data, absolute values."""

    families: list[Family]

    def encode(self) -> list[bytes]:
        return [Kind.METRICS.value, msgpack.packb(self.families)]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Metrics:
        return cls(msgpack.unpackb(frames[1]))


@attrs.frozen
class Retire:
    """The shard's resident memory (MiB) is over ``worker.max_rss_mb``."""

    rss_mb: int

    def encode(self) -> list[bytes]:
        return [Kind.RETIRE.value + _RETIRE.pack(self.rss_mb)]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Retire:
        return cls(_RETIRE.unpack(frames[0][1:])[0])


ShardMessage = Hello | Ready | Failed | Record | Drop | Skip | Settle | Metrics | Retire

_FROM_SHARD: dict[bytes, type[ShardMessage]] = {
    Kind.HELLO.value: Hello,
    Kind.READY.value: Ready,
    Kind.FAILED.value: Failed,
    Kind.RECORD.value: Record,
    Kind.DROP.value: Drop,
    Kind.SKIP.value: Skip,
    Kind.SETTLE.value: Settle,
    Kind.METRICS.value: Metrics,
    Kind.RETIRE.value: Retire,
}


def decode(frames: list[bytes]) -> ShardMessage:
    """A shard's message (read by the main); ``MessageError`` when it is not one."""
    cls = _FROM_SHARD.get(frames[0][:1]) if frames and frames[0] else None
    if cls is None:
        msg = "not a shard message"
        raise MessageError(msg)
    try:
        return cls.decode(frames)
    except (IndexError, struct.error, ValueError, TypeError, msgpack.UnpackException) as e:
        msg = f"a malformed {cls.__name__} message ({type(e).__name__})"
        raise MessageError(msg) from e


def decode_for_shard(frames: list[bytes]) -> Exit | handoff.HandoffMessage:
    """A message from the main (read by a shard): ``Exit`` or a hand-off message."""
    if frames and frames[0][:1] == Kind.EXIT.value:
        return Exit()
    return handoff.decode(frames)
