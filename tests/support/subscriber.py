"""The test subscriber: a real ZeroMQ SUB socket reading one tap's records.

``TapSubscriber`` reads on a thread of its own from the moment it is created,
so it keeps reading whatever the test's event loop does (a blocking call, a
module-scoped loop that is not running). It keeps, in arrival order, every
record (decoded envelope), its transport message, every heartbeat and the raw
bytes of every frame, and offers async waits that fail with a message saying
what did not arrive (``processes.wait_until``).

Records are read with ``records/wire.py`` from raw frames, as a consumer written
to SPEC sections 3 and 4 would read them; the topic frame is compared exactly
(a subscription matches by prefix), and messages of any other topic are kept
apart in ``foreign``.

Run as a program (``python -m tests.support.subscriber ENDPOINT TOPIC FILE``) it
writes one line per record (``r PUBLISHER SEQ``) and per heartbeat (``h
PUBLISHER NEXT_SEQ DROPPED FULL``) to FILE, line-buffered: a subscriber in a
process of its own, that a test can stop with SIGSTOP; ``read_lines`` reads
the file back.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import zmq

from shadow_proxy.devtools.processes import wait_until
from shadow_proxy.records import wire

#: How long the reading thread blocks in one poll (its reaction time to close).
POLL_MS = 50
#: Default wait for records and heartbeats (a heartbeat comes every second).
WAIT_S = 10.0


@attrs.frozen
class Received:
    """What arrived so far on one tap (a consistent copy)."""

    records: list[dict[str, Any]]
    messages: list[wire.Message]
    heartbeats: list[tuple[wire.Message, wire.Heartbeat]]


class TapSubscriber:
    """A SUB socket on ``topic`` (and its heartbeats) at ``endpoint``, read by a thread.

    Guarantees: every message the socket receives is kept, in arrival order,
    until ``close``; nothing is decoded twice. ``close`` (or leaving the
    ``with`` block) stops the thread and closes the socket with no linger.
    """

    def __init__(self, endpoint: str, topic: str, *, rcvhwm: int = 0) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.heartbeat_topic = wire.heartbeat_topic(topic)
        self.records: list[dict[str, Any]] = []
        self.messages: list[wire.Message] = []
        self.heartbeats: list[tuple[wire.Message, wire.Heartbeat]] = []
        #: Messages on another topic that shares the subscription's prefix.
        self.foreign: list[str] = []
        self.raw = bytearray()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, rcvhwm)
        self._socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._socket.connect(endpoint)
        self._thread = threading.Thread(target=self._run, name=f"sub-{topic}", daemon=True)
        self._thread.start()

    # -- the reading thread --------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stopping.is_set():
            if not poller.poll(POLL_MS):
                continue
            while True:
                try:
                    frames = self._socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._accept(frames)

    def _accept(self, frames: list[bytes]) -> None:
        message = wire.decode_frames(frames)
        with self._lock:
            for frame in frames:
                self.raw += frame
            if message.topic == self.heartbeat_topic:
                self.heartbeats.append((message, wire.Heartbeat.decode(message.payload)))
            elif message.topic == self.topic:
                self.messages.append(message)
                self.records.append(wire.decode_envelope(message.payload))
            else:
                self.foreign.append(message.topic)

    # -- reading what arrived -------------------------------------------------------

    def received(self) -> Received:
        with self._lock:
            return Received(list(self.records), list(self.messages), list(self.heartbeats))

    def has(self, n: int) -> bool:
        """At least ``n`` records have arrived."""
        return len(self.records) >= n

    def of(self, request_id: str) -> list[dict[str, Any]]:
        """The records of one request, in arrival order."""
        with self._lock:
            return [r for r in self.records if r["request_id"] == request_id]

    @property
    def heartbeat(self) -> wire.Heartbeat | None:
        """The last heartbeat (None before the first)."""
        with self._lock:
            return self.heartbeats[-1][1] if self.heartbeats else None

    def raw_bytes(self) -> bytes:
        with self._lock:
            return bytes(self.raw)

    # -- waiting ------------------------------------------------------------------

    async def wait_heartbeats(self, count: int = 1, timeout: float = WAIT_S) -> wire.Heartbeat:
        """Wait until ``count`` heartbeats in all have arrived; the last one. The
        first proves the subscription reached the publisher (no slow joiner)."""
        await wait_until(
            lambda: len(self.heartbeats) >= count,
            timeout,
            what=f"{self.topic}: {count} heartbeat(s) (got {len(self.heartbeats)})",
        )
        return self.heartbeats[-1][1]

    async def wait_records(self, n: int, timeout: float = WAIT_S) -> list[dict[str, Any]]:
        """Wait until ``n`` records in all have arrived; returns them all."""
        await wait_until(
            lambda: self.has(n),
            timeout,
            what=f"{self.topic}: {n} record(s) (got {len(self.records)})",
        )
        return self.received().records

    async def wait_requests(
        self, request_ids: Iterable[str], timeout: float = WAIT_S
    ) -> dict[str, dict[str, Any]]:
        """Wait until each request has its record; fails naming the missing
        ones. Returns each request's first record."""
        ids = list(request_ids)

        def missing() -> list[str]:
            with self._lock:
                seen = {r["request_id"] for r in self.records}
            return [i for i in ids if i not in seen]

        await wait_until(
            lambda: not missing(),
            timeout,
            what=f"{self.topic}: a record for each of {len(ids)} requests (missing {missing()})",
        )
        with self._lock:
            first: dict[str, dict[str, Any]] = {}
            for record in self.records:
                first.setdefault(record["request_id"], record)
        return {i: first[i] for i in ids}

    async def wait_settled(self, timeout: float = WAIT_S) -> wire.Heartbeat:
        """Wait for a heartbeat that accounts for every record received (a
        record sent twice would take a second ``seq``), and return it."""

        def caught_up() -> wire.Heartbeat | None:
            with self._lock:
                beat = self.heartbeats[-1][1] if self.heartbeats else None
                return beat if beat is not None and beat.published == len(self.records) else None

        return await wait_until(
            caught_up, timeout, what=f"{self.topic}: a heartbeat counting every record"
        )

    # -- closing ------------------------------------------------------------------

    def close(self) -> None:
        """Stop reading and close the socket (idempotent)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._thread.join(5)
        self._socket.close(linger=0)
        self._context.term()

    def __enter__(self) -> TapSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- as a program


def line_for(message: wire.Message, topic: str) -> str:
    """The line the program writes for one message."""
    if message.topic == topic:
        return f"r {message.publisher_id} {wire.decode_envelope(message.payload)['seq']}\n"
    beat = wire.Heartbeat.decode(message.payload)
    dropped = sum(beat.dropped.values())
    return f"h {beat.publisher_id} {beat.next_seq} {dropped} {beat.dropped.get('full', 0)}\n"


def run_to_file(endpoint: str, topic: str, out: Path) -> None:
    """Subscribe and write a line per message to ``out`` until killed."""
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.connect(endpoint)
    socket.subscribe(topic.encode())
    with out.open("w", buffering=1) as f:
        while True:
            f.write(line_for(wire.decode_frames(socket.recv_multipart()), topic))


def read_lines(path: Path) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Received seqs and heartbeats (next_seq, dropped, full) from the program's file."""
    received: list[int] = []
    beats: list[tuple[int, int, int]] = []
    if not path.exists():
        return received, beats
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[0] == "r" and len(parts) == 3:
            received.append(int(parts[2]))
        elif parts[0] == "h" and len(parts) == 5:
            beats.append((int(parts[2]), int(parts[3]), int(parts[4])))
    return received, beats


if __name__ == "__main__":
    run_to_file(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
