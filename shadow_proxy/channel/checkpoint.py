"""The tap worker's publishing state, kept where a SIGKILL cannot take it.

Written by the worker's main (the one process that takes seqs and sends on tap
sockets, ``worker/main/loop.py``); read by the serving process after that worker
died (``serving/handoff.py``). Pure apart from the mapped file: no aiohttp, no
zmq.

The rule that makes a worker's death countable: **the main sends no record
whose seq it has not checkpointed.** It writes a checkpoint before each batch
of sends (claiming the seqs taken so far) and after it (the counts sent). The
file is mapped in memory, so a write is a few stores and the kernel keeps the
pages when the process dies. Two slots, written in turn, each with a counter
and a CRC: a write cut by the kill leaves the other slot, which still claims
every seq that was sent.

Within a batch, each record that leaves a tap's queue is noted at once in the
tap's ``Progress`` (its sent, failed and late counts and transport sequence:
a few bytes with their own CRC, beside the slots). A kill in the middle of a
batch then counts as lost only the records not handed to the socket, never
one a consumer received. What ZeroMQ had taken but not yet written to the
network when the process died is lost after its send: the consumer sees it as
a transport-sequence gap of that publisher, as SPEC 4 says of ZeroMQ's losses.

After the death the serving process knows what the worker could not: how many
requests it handed over on that connection, how many it could not hand over,
and how many arrived while no worker was there. ``final_states`` turns that
and the checkpoint into each tap's final state: every request the dead worker
had not resolved for a tap, every record it held unsent, counted as
``worker_died`` with its seq taken in the dead publisher's space. The next
worker announces these states on the dead publisher ids (a last heartbeat:
``next_seq`` past the lost records), so a consumer counts the loss as the tail
loss of that publisher, and ``/metrics`` continues from the final counters.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from pathlib import Path

import attrs
import msgpack

#: Slot header: write counter, body length, CRC-32 of the body.
_SLOT_HEADER = struct.Struct(">QII")
#: A tap's progress: published, publish errors, late drops, next transport
#: sequence; then the CRC-32 of those 32 bytes.
_PROGRESS = struct.Struct(">QQQQ")
_PROGRESS_BYTES = _PROGRESS.size + 4


@attrs.frozen
class TapState:
    """One tap's publisher as checkpointed: identity, sequences and loss counters."""

    name: str
    publisher_id: int
    #: Seqs below this are taken (published, dropped, or queued to be sent).
    next_seq: int = 0
    #: Requests of this connection whose fate on this tap is decided (a record
    #: queued or dropped with its seq, a skip, or not mirrored at all).
    resolved: int = 0
    next_transport: int = 0
    heartbeats_sent: int = 0
    queued: int = 0
    published: int = 0
    publish_errors: int = 0
    dropped: dict[str, int] = attrs.field(factory=dict)
    skipped: dict[str, int] = attrs.field(factory=dict)

    @property
    def unsent(self) -> int:
        """Records with a seq that were neither sent, nor failed, nor counted lost."""
        return self.next_seq - self.published - self.publish_errors - sum(self.dropped.values())


@attrs.frozen
class Progress:
    """A tap's sends as they happen (between two checkpoints)."""

    published: int
    publish_errors: int
    late: int
    next_transport: int

    def apply(self, state: TapState) -> TapState:
        """``state`` with what was sent since it was written (counts only grow)."""
        dropped = dict(state.dropped)
        dropped["late"] = max(dropped.get("late", 0), self.late)
        return attrs.evolve(
            state,
            published=max(state.published, self.published),
            publish_errors=max(state.publish_errors, self.publish_errors),
            next_transport=max(state.next_transport, self.next_transport),
            dropped=dropped,
        )


@attrs.frozen
class Checkpoint:
    #: The worker's incarnation (given by the serving process at spawn).
    generation: int
    #: Requests the serving loop could not hand over, already counted by this worker.
    lost_seen: int
    taps: tuple[TapState, ...]

    def encode(self) -> bytes:
        fields = _TAP_FIELDS
        return msgpack.packb(
            [self.generation, self.lost_seen, [[getattr(t, f) for f in fields] for t in self.taps]]
        )

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        generation, lost_seen, taps = msgpack.unpackb(data, strict_map_key=False)
        return cls(generation, lost_seen, tuple(TapState(*t) for t in taps))


#: A ``TapState``'s fields in order (what ``attrs.astuple`` gives, without its cost
#: on every send).
_TAP_FIELDS = tuple(field.name for field in attrs.fields(TapState))


def final_states(
    checkpoint: Checkpoint, *, requests_sent: int, lost_total: int, dead_requests: int
) -> tuple[TapState, ...]:
    """Each tap's state once the loss of a dead worker is counted.

    ``requests_sent``: requests the serving loop handed to that worker (its
    connection); ``lost_total``: requests it could not hand over, since start;
    ``dead_requests``: requests that arrived while no worker was connected.
    Lost per tap: the unresolved requests and the unsent records (reason
    ``worker_died``, as are the dead-window requests) and the hand-off losses
    the worker had not counted yet (``handoff_full``). Like ``handoff_full``,
    a lost request counts on every tap, also those that would have skipped it.
    """
    handoff_lost = max(0, lost_total - checkpoint.lost_seen)
    finals = []
    for tap in checkpoint.taps:
        unresolved = max(0, requests_sent - tap.resolved)
        died = tap.unsent + unresolved + dead_requests
        dropped = dict(tap.dropped)
        if died:
            dropped["worker_died"] = dropped.get("worker_died", 0) + died
        if handoff_lost:
            dropped["handoff_full"] = dropped.get("handoff_full", 0) + handoff_lost
        finals.append(
            attrs.evolve(
                tap,
                next_seq=tap.next_seq + unresolved + dead_requests + handoff_lost,
                resolved=requests_sent,
                dropped=dropped,
            )
        )
    return tuple(finals)


#: The per-tap counters a checkpoint holds, as metric sample names.
COUNTER_SAMPLES = (
    "shadow_tap_queued_total",
    "shadow_tap_published_total",
    "shadow_tap_dropped_total",
    "shadow_tap_publish_errors_total",
    "shadow_tap_skipped_total",
)


def counter_samples(state: TapState) -> list[tuple[str, dict[str, str], int]]:
    """The tap's counters as ``(sample name, labels, value)``."""
    tap = {"tap": state.name}
    samples = [
        ("shadow_tap_queued_total", tap, state.queued),
        ("shadow_tap_published_total", tap, state.published),
        ("shadow_tap_publish_errors_total", tap, state.publish_errors),
    ]
    for name, counts in (
        ("shadow_tap_dropped_total", state.dropped),
        ("shadow_tap_skipped_total", state.skipped),
    ):
        samples += [(name, {**tap, "reason": reason}, n) for reason, n in counts.items()]
    return samples


class CheckpointFile:
    """Two slots in a memory-mapped file (``write`` alternates between them), then
    one progress record per tap."""

    def __init__(self, path: str | Path, taps: int):
        self.path = str(path)
        self.slot_bytes = slot_bytes = self.size_for(taps)
        size = 2 * slot_bytes + taps * _PROGRESS_BYTES
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._count = 0

    @staticmethod
    def size_for(taps: int) -> int:
        """Bytes per slot that hold ``taps`` tap states with room to spare."""
        return 4096 + 1024 * taps

    def progress(self, tap: int, progress: Progress) -> None:
        """Note tap ``tap``'s sends now (a record just left its queue)."""
        body = _PROGRESS.pack(
            progress.published, progress.publish_errors, progress.late, progress.next_transport
        )
        offset = 2 * self.slot_bytes + tap * _PROGRESS_BYTES
        self._map[offset : offset + _PROGRESS.size] = body
        self._map[offset + _PROGRESS.size : offset + _PROGRESS_BYTES] = zlib.crc32(body).to_bytes(
            4, "big"
        )

    def write(self, checkpoint: Checkpoint) -> None:
        body = checkpoint.encode()
        if _SLOT_HEADER.size + len(body) > self.slot_bytes:
            msg = f"checkpoint of {len(body)} bytes exceeds its slot of {self.slot_bytes}"
            raise ValueError(msg)
        self._count += 1
        offset = (self._count % 2) * self.slot_bytes
        start = offset + _SLOT_HEADER.size
        self._map[start : start + len(body)] = body
        _SLOT_HEADER.pack_into(self._map, offset, self._count, len(body), zlib.crc32(body))

    def close(self) -> None:
        self._map.close()


def read_checkpoint(path: str | Path) -> Checkpoint | None:
    """The newest whole checkpoint in the file (None: no file, or no whole slot)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    best: tuple[int, bytes] | None = None
    # The file is two slots of ``size_for(taps)`` bytes, then the taps' progress.
    taps, extra = divmod(len(data) - 2 * CheckpointFile.size_for(0), 2 * 1024 + _PROGRESS_BYTES)
    if taps < 0 or extra:
        return None
    slot = CheckpointFile.size_for(taps)
    for offset in (0, slot):
        if slot < _SLOT_HEADER.size:
            break
        count, length, crc = _SLOT_HEADER.unpack_from(data, offset)
        body = data[offset + _SLOT_HEADER.size : offset + _SLOT_HEADER.size + length]
        whole = count and len(body) == length and zlib.crc32(body) == crc
        if whole and (best is None or count > best[0]):
            best = (count, body)
    if best is None:
        return None
    try:
        checkpoint = Checkpoint.decode(best[1])
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    states = []
    for index, state in enumerate(checkpoint.taps):
        offset = 2 * slot + index * _PROGRESS_BYTES
        record = data[offset : offset + _PROGRESS_BYTES]
        whole = len(record) == _PROGRESS_BYTES and zlib.crc32(
            record[: _PROGRESS.size]
        ) == int.from_bytes(record[_PROGRESS.size :], "big")
        if whole and any(record[: _PROGRESS.size]):
            state = Progress(*_PROGRESS.unpack(record[: _PROGRESS.size])).apply(state)
        states.append(state)
    return attrs.evolve(checkpoint, taps=tuple(states))
