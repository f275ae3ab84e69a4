"""The hand-off from the serving loop to the tap worker: bounded, never blocking.

A Unix stream socket in the serving process's private directory: the serving
process listens, the worker's main connects. The serving loop writes with its
own uvloop transport: messages are gathered and flushed once per loop
iteration (one ``writev`` for every message of that iteration), with no
I/O thread to wake and no extra system call per message. The messages are
``channel/handoff.py``'s; framing ``channel.stream.stream_buffers`` (a u32
length, then each frame's length and bytes; the frames are not copied).

Bounded in bytes: a message that would put more than ``max_bytes`` in the
transport's buffer (what the worker has not read yet, beyond the kernel's
socket buffers) is dropped and counted (``full``) instead of queued. While no
worker is connected, every message is dropped as ``worker_dead``. The loop
never waits: the transport writes what the kernel takes and keeps the rest.

A worker's death is accounted for here, the process that survives it: each
connection counts the requests handed over on it; at the next connection the
dead worker's checkpoint (``channel/checkpoint.py``, read by the supervisor)
and these counts give each tap's final state, which the new worker receives
in its hello message and announces on the dead publisher ids.

The serving loop's cost per message is a few microseconds: no JSON, no
tokenizer, no MessagePack; the worker does all of that in its own processes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable

from shadow_proxy.channel import checkpoint as cp
from shadow_proxy.channel.handoff import (
    KEY,
    Chunks,
    End,
    HandoffMessage,
    Head,
    Hello,
    Last,
    Pieces,
    Request,
)
from shadow_proxy.channel.stream import stream_buffers
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.serving.metrics import ProxyMetrics

log = logging.getLogger(__name__)

#: A worker connected for less than this may not have announced its dead
#: predecessors' final states: its successor announces them again.
ANNOUNCE_S = 10.0


class HandoffDrop(enum.StrEnum):
    """Why the serving loop dropped a hand-off message (``shadow_handoff_dropped_total``)."""

    #: It would put more than ``worker.handoff_max_bytes`` in the transport's buffer.
    FULL = "full"
    #: No worker was connected.
    WORKER_DEAD = "worker_dead"
    #: The hand-off was closing.
    CLOSED = "closed"


class _Protocol(asyncio.Protocol):
    """One connection from a worker's main; the worker never writes on it."""

    def __init__(self, handoff: Handoff):
        self.handoff = handoff
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.handoff._connected(self)

    def connection_lost(self, exc) -> None:
        self.handoff._disconnected(self)

    def data_received(self, data) -> None:
        pass


class Handoff:
    """The serving process's end of the channel to the tap worker."""

    def __init__(
        self,
        path: str,
        max_bytes: int,
        metrics: ProxyMetrics,
        *,
        full_response: bool = True,
        on_final_states: Callable[[int, tuple[cp.TapState, ...]], None] | None = None,
    ):
        self.path = path
        self.max_bytes = max_bytes
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._protocol: _Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._flush_scheduled = False
        #: Writes to the socket (one per loop iteration with messages).
        self.flushes = 0
        dropped = metrics.handoff_dropped
        self._dropped_full = dropped.labels(HandoffDrop.FULL)
        self._dropped_dead = dropped.labels(HandoffDrop.WORKER_DEAD)
        self._dropped_closed = dropped.labels(HandoffDrop.CLOSED)
        self._next_key = 0
        #: Requests whose ``q`` message could not be queued (since start): the
        #: worker counts each on every tap (``handoff_full``), its seq taken.
        self._lost_requests = 0
        #: Requests handed over on the current connection.
        self._requests_sent = 0
        #: Requests that arrived while no worker was connected.
        self._dead_requests = 0
        self.worker_alive = False
        #: Whether taps need the whole response (joined records) or only its
        #: tail (where ``usage`` is, for the prompt-token fidelity check).
        self.full_response = full_response
        #: The incarnation the supervisor spawned last (it connects next).
        self.generation = 0
        self._connected_generation = 0
        self._connected_at = 0.0
        #: The last connection's (generation, requests handed over), once it is lost.
        self._dead: tuple[int, int] | None = None
        self._dead_checkpoint: cp.Checkpoint | None = None
        #: Final states of dead publishers the next worker announces.
        self._tombstones: list[cp.TapState] = []
        #: Called with the final states when a dead worker has been accounted for.
        #: (the dead worker's generation, its taps' final states)
        self.on_final_states = on_final_states

    async def start(self) -> None:
        """Listen on ``path`` (the worker connects)."""
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_unix_server(lambda: _Protocol(self), self.path)

    def close(self) -> None:
        """Send the last message (``Last``: nothing follows it on this pipe, so the
        worker knows it has read everything), then close after the buffer is
        written."""
        if self._transport is not None:
            self._send(Last())
            self._flush()
            self._transport.close()
        if self._server is not None:
            self._server.close()

    def worker_died(self, checkpoint: cp.Checkpoint | None) -> None:
        """The supervisor saw the worker exit and read its checkpoint file."""
        if checkpoint is not None and checkpoint.generation == self._connected_generation:
            self._dead_checkpoint = checkpoint

    # -- the connection ----------------------------------------------------------

    def _connected(self, protocol: _Protocol) -> None:
        transport = protocol.transport
        if transport is None:
            return
        if self._protocol is not None:  # one worker at a time
            transport.close()
            return
        now = time.monotonic()
        if self._dead is not None:
            generation, sent = self._dead
            checkpoint = self._dead_checkpoint  # of that generation (``worker_died``)
            if checkpoint is not None:
                finals = cp.final_states(
                    checkpoint,
                    requests_sent=sent,
                    lost_total=self._lost_requests,
                    dead_requests=self._dead_requests,
                )
                replaced = {f.publisher_id for f in finals}
                self._tombstones = [
                    t for t in self._tombstones if t.publisher_id not in replaced
                ] + list(finals)
                if self.on_final_states is not None:
                    self.on_final_states(generation, finals)
            else:
                log.error(
                    "tap worker %d left no checkpoint: %d request(s) it had are not counted",
                    generation,
                    sent + self._dead_requests,
                )
        self._dead = None
        self._dead_checkpoint = None
        self._dead_requests = 0
        self._requests_sent = 0
        self._protocol = protocol
        self._transport = transport
        self._connected_generation = self.generation
        self._connected_at = now
        hello = Hello(self.generation, self._lost_requests, tuple(self._tombstones))
        buffers, _ = stream_buffers(hello.encode())
        transport.writelines(buffers)
        self.worker_alive = True

    def _disconnected(self, protocol: _Protocol) -> None:
        if protocol is not self._protocol:
            return
        self._protocol = None
        self._transport = None
        self._pending = []
        self._pending_bytes = 0
        self.worker_alive = False
        self._dead = (self._connected_generation, self._requests_sent)
        if time.monotonic() - self._connected_at >= ANNOUNCE_S:
            self._tombstones = []  # announced for long enough

    # -- messages ----------------------------------------------------------------

    def _send(self, message: HandoffMessage) -> bool:
        transport = self._transport
        if transport is None:
            self._dropped_dead.inc()
            return False
        buffers, size = stream_buffers(message.encode())
        if transport.get_write_buffer_size() + self._pending_bytes + size > self.max_bytes:
            self._dropped_full.inc()
            return False
        self._pending += buffers
        self._pending_bytes += size
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None  # set by start(), before any connection
            self._loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._pending:
            if self._transport is not None:
                self._transport.writelines(self._pending)
                self.flushes += 1
            self._pending = []
            self._pending_bytes = 0

    def open(
        self,
        route: Route,
        request_id: str,
        body: bytes,
        arrival_unix_ns: int,
        arrival_mono_ns: int,
        headers: bytes = b"",
        content_encoding: str = "",
    ) -> Capture | None:
        """Hand a request to the worker; returns the capture for its response,
        or None when the request could not be handed over (counted).

        ``body`` is the bytes the client sent (compressed if it sent them so);
        ``headers`` the allow-listed request headers (``channel.headers.pick``);
        ``content_encoding`` the body's header, for the worker to decode its copy.
        """
        key = KEY.pack(self._next_key)
        self._next_key += 1
        request = Request(
            key,
            route,
            arrival_unix_ns,
            arrival_mono_ns,
            self._lost_requests,
            request_id,
            body,
            headers,
            content_encoding,
        )
        if self._send(request):
            self._requests_sent += 1
            return Capture(self, key, arrival_mono_ns, self.full_response)
        if self._transport is None:
            self._dead_requests += 1
        else:
            self._lost_requests += 1
        return None


class Capture:
    """One request's response, handed to the worker as it streams by.

    Guarantees: ``end`` is called exactly once by the proxy and sends the end
    message (or counts its loss). After a message is lost, the rest of the
    exchange is not sent and the end says ``CAPTURE_LOST``, so the worker never
    builds a record from a partial copy.

    Chunks are batched: the capture keeps references to at most
    ``BATCH_CHUNKS`` chunks or ``BATCH_BYTES`` bytes (each with the monotonic
    offset at which it came from the frontend), then sends them as one
    message; the end message carries the rest. The response head (status,
    content type and encoding) travels with the first of these. A short
    stream costs two messages (request, end) instead of one per chunk.

    Without joined taps (``full`` false) no chunk is sent: the capture keeps the
    last ``TAIL_CHUNKS`` chunks and sends them with the end, which is where a
    response carries ``usage``.
    """

    TAIL_CHUNKS = 2
    BATCH_CHUNKS = 32
    BATCH_BYTES = 64 * 1024
    __slots__ = (
        "_arrival",
        "_bytes",
        "_chunks",
        "_full",
        "_handoff",
        "_head",
        "_key",
        "_lost",
        "_offsets",
    )

    def __init__(self, handoff: Handoff, key: bytes, arrival_mono_ns: int, full: bool):
        self._handoff = handoff
        self._key = key
        self._arrival = arrival_mono_ns
        self._full = full
        self._lost = False
        self._chunks: list[bytes] = []
        self._offsets: list[int] = []
        self._bytes = 0
        self._head: Head | None = None

    def head(
        self, status: int, content_type: str, content_encoding: str, sent_mono_ns: int = 0
    ) -> None:
        """The response started; sent with the next chunk batch or the end.
        ``sent_mono_ns``: when the request was sent to the frontend (0: it was not)."""
        offset = time.monotonic_ns() - self._arrival
        sent = max(1, sent_mono_ns - self._arrival) if sent_mono_ns else 0
        self._head = Head(status, offset, content_type, content_encoding, sent)

    def chunk(self, data: bytes, received_mono_ns: int = 0) -> None:
        """A chunk the client was sent; ``received_mono_ns``: when it came from
        the frontend (default: now)."""
        if self._lost:
            return
        chunks, offsets = self._chunks, self._offsets
        chunks.append(data)
        offsets.append((received_mono_ns or time.monotonic_ns()) - self._arrival)
        if not self._full:
            if len(chunks) > self.TAIL_CHUNKS:
                del chunks[0], offsets[0]
            return
        self._bytes += len(data)
        if len(chunks) >= self.BATCH_CHUNKS or self._bytes >= self.BATCH_BYTES:
            self._lost = not self._handoff._send(
                Chunks(self._key, self._head, offsets, Pieces.of(chunks))
            )
            self._head = None
            self._chunks, self._offsets = [], []
            self._bytes = 0

    def end(self, kind: EndKind, detail: str = "") -> None:
        if self._lost:
            kind = EndKind.CAPTURE_LOST
            self._chunks.clear()
            self._offsets.clear()
        offset = time.monotonic_ns() - self._arrival
        end = End(
            self._key, kind, offset, self._head, detail, self._offsets, Pieces.of(self._chunks)
        )
        self._handoff._send(end)
