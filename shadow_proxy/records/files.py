"""Record files: what ``shadow-consumer --record`` keeps, and every tool reads.

A record file is a sequence of entries, each a u32 big-endian length and then a
MessagePack map with the event plane's message fields (``publisher_id``,
``sequence``, ``published_at``, ``topic``, ``payload``; SPEC section 4), so a
record keeps the publisher id that ``(publisher_id, tap, seq)`` deduplication
needs. Files written before the publisher id was kept hold the bare envelope
map instead; they read as messages with publisher id 0 (no real publisher has
id 0) and sequence 0.

Writing rotates by size: when the next entry would take ``FILE`` past
``max_bytes``, ``FILE`` becomes ``FILE.1`` (``FILE.1`` becomes ``FILE.2`` ...)
and at most ``keep`` old files are kept. The writer flushes to the operating
system at least every ``flush_interval_s`` and at close, so a crashed consumer
loses at most that interval of records (a crashed machine may lose what the
kernel had not written).

Reading streams one entry at a time (memory: the largest entry) and never
raises on bad bytes: a damaged entry is reported (``Unreadable``) and, where the
length prefix cannot be trusted, the rest of the file is.
"""

from __future__ import annotations

import glob
import os
import re
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import attrs
import msgpack

from shadow_proxy.records.wire import Message

LENGTH = struct.Struct(">I")
#: An entry larger than this is taken for a damaged length prefix.
MAX_ENTRY_BYTES = 1 << 30
_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<n>\d+)$")


@attrs.frozen
class Unreadable:
    """Bytes of a record file that hold no message; ``reason`` is a fixed word."""

    path: str
    offset: int
    reason: str
    #: How many bytes were passed over (the rest of the file when unknown).
    skipped_bytes: int


def encode_entry(message: Message) -> bytes:
    """One file entry: length prefix and the message map."""
    body = msgpack.packb(
        {
            "publisher_id": message.publisher_id,
            "sequence": message.sequence,
            "published_at": message.published_at_ms,
            "topic": message.topic,
            "payload": message.payload,
        },
        use_bin_type=True,
    )
    return LENGTH.pack(len(body)) + body


def decode_entry(body: bytes) -> Message | None:
    """The message an entry's body holds; None when it holds none."""
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types
        return None
    if not isinstance(value, dict):
        return None
    payload = value.get("payload")
    if isinstance(payload, bytes):
        publisher_id, sequence = value.get("publisher_id"), value.get("sequence")
        published_at, topic = value.get("published_at", 0), value.get("topic", "")
        numbers = (publisher_id, sequence, published_at)
        if not all(type(v) is int and v >= 0 for v in numbers) or not isinstance(topic, str):
            return None
        return Message(topic, *numbers, payload)  # type: ignore[arg-type]
    if "schema_version" in value:  # a bare envelope (files from before publisher ids)
        return Message(str(value.get("tap", "")), 0, 0, 0, body)
    return None


def read_entries(path: Path) -> Iterator[Message | Unreadable]:
    """The messages of one file in order, with ``Unreadable`` for damaged bytes."""
    name = str(path)
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while offset < size:
            prefix = f.read(LENGTH.size)
            if len(prefix) < LENGTH.size:
                yield Unreadable(name, offset, "truncated", size - offset)
                return
            (length,) = LENGTH.unpack(prefix)
            if length > MAX_ENTRY_BYTES or offset + LENGTH.size + length > size:
                yield Unreadable(name, offset, "truncated", size - offset)
                return
            body = f.read(length)
            message = decode_entry(body)
            if message is None:
                yield Unreadable(name, offset, "entry", LENGTH.size + length)
            else:
                yield message
            offset += LENGTH.size + length


def read_payloads(path: Path) -> list[bytes]:
    """The envelope payloads of one file (for tests and small tools)."""
    return [m.payload for m in read_entries(path) if isinstance(m, Message)]


def expand(specs: Sequence[str | Path]) -> list[Path]:
    """The files a list of paths, directories and globs names, in reading order.

    Specs are taken in the order given. A directory stands for the files in it,
    a glob for the files it matches. Within one spec, the files of one rotated
    set (``FILE.3``, ``FILE.2``, ``FILE.1``, ``FILE``) come oldest first; sets
    are sorted by name. A name that matches nothing is a ``FileNotFoundError``.
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for spec in specs:
        text = str(spec)
        path = Path(text)
        if path.is_dir():
            found = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
        elif glob.has_magic(text):
            found = [Path(p) for p in glob.glob(text) if Path(p).is_file()]
        elif path.is_file():
            found = [path]
        else:
            msg = f"no record file at {text}"
            raise FileNotFoundError(msg)
        if not found:
            msg = f"no record files in {text}"
            raise FileNotFoundError(msg)
        for p in sorted(found, key=_reading_order):
            if p not in seen:
                seen.add(p)
                out.append(p)
    return out


def _reading_order(path: Path) -> tuple[str, int]:
    """Rotated sets oldest first: ``f.2`` < ``f.1`` < ``f``."""
    match = _ROTATED.match(path.name)
    if match:
        return str(path.with_name(match["base"])), -int(match["n"])
    return str(path), 0


@attrs.define
class RecordFile:
    """Writes entries to ``path``, rotating by size and flushing by time."""

    path: Path
    max_bytes: int
    keep: int
    flush_interval_s: float = 1.0
    _file: IO[bytes] | None = None
    _size: int = 0
    _flushed_at: float = 0.0

    def write(self, message: Message) -> None:
        entry = encode_entry(message)
        file = self._file if self._file is not None else self._open()
        if self._size > 0 and self._size + len(entry) > self.max_bytes:
            file = self._rotate()
        file.write(entry)
        self._size += len(entry)
        now = time.monotonic()
        if now - self._flushed_at >= self.flush_interval_s:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Hand what is buffered to the operating system."""
        if self._file is not None:
            self._file.flush()
        self._flushed_at = time.monotonic() if now is None else now

    def _open(self) -> IO[bytes]:
        self._file = file = self.path.open("ab")
        self._size = file.tell()
        self._flushed_at = time.monotonic()
        return file

    def _rotate(self) -> IO[bytes]:
        if self._file is not None:
            self._file.close()
        oldest = self.path.with_name(f"{self.path.name}.{self.keep}")
        oldest.unlink(missing_ok=True)
        for k in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{k}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{k + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._file = file = self.path.open("wb")
        self._size = 0
        return file

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
