"""The hand-off from the serving loop to the tap worker: bounded, never blocking.

One ZeroMQ PUSH socket, bound on an ``ipc://`` path; the worker connects a PULL
socket. Every send is ``NOBLOCK``: when the worker lags and the high-water
mark is reached, ``zmq.Again`` is a dropped message, counted with a reason,
and the serving loop goes on. Frames are built by ``channel.frames`` and
sent without copying the body (see docs/INTERNALS.md for the message table).

ZeroMQ bounds messages, not bytes; the bytes are bounded here: the worker
reports how many bytes it has read (every 50 ms while busy), and a message
that would put more than ``max_bytes`` in flight is dropped and counted
(``full``) instead of sent.

The serving loop's cost per message is a few microseconds: no JSON, no
tokenizer, no MessagePack; the worker does all of that in its own process.
"""

from __future__ import annotations

import time

import zmq

from shadow_proxy.channel import frames as hf
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.serving.metrics import ProxyMetrics

#: Linger at close: what is still queued after this is lost (the worker is
#: stopping too).
LINGER_MS = 500
_MORE = zmq.NOBLOCK | zmq.SNDMORE  # ints: pyzmq's enum arithmetic costs per frame
_LAST = zmq.NOBLOCK


class Handoff:
    """The serving process's end of the channel to the tap worker."""

    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        capacity: int,
        max_bytes: int,
        metrics: ProxyMetrics,
    ):
        self.endpoint = endpoint
        self.max_bytes = max_bytes
        #: Bytes sent, and bytes the worker says it has read (``progress``).
        self._sent_bytes = 0
        self.acked_bytes = 0
        self._socket = context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, capacity)
        self._socket.setsockopt(zmq.LINGER, LINGER_MS)
        self._socket.bind(endpoint)
        dropped = metrics.handoff_dropped
        self._dropped_full = dropped.labels("full")
        self._dropped_dead = dropped.labels("worker_dead")
        self._dropped_closed = dropped.labels("closed")
        self._next_key = 0
        #: Requests whose ``q`` message was lost: the worker adds these to each
        #: tap's dropped count (reason ``handoff_full``) and seq.
        self._lost_requests = 0
        self.worker_alive = True
        #: Whether taps need the whole response (joined records) or only its
        #: tail (where ``usage`` is, for the prompt-token fidelity check).
        self.full_response = True

    def close(self) -> None:
        """Send the last message (``frames.LAST_MESSAGE``: nothing follows it on
        this pipe, so the worker knows it has read everything), then close."""
        try:
            self._socket.send(hf.LAST_MESSAGE, flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self._socket.close(linger=LINGER_MS)

    def restarted(self) -> None:
        """A new worker is ready: it starts from nothing (new publishers, seq 0)."""
        self._lost_requests = 0
        self._sent_bytes = 0
        self.acked_bytes = 0
        self.worker_alive = True

    def _send(self, frames: list[bytes]) -> bool:
        if not self.worker_alive:
            self._dropped_dead.inc()
            return False
        size = sum(map(len, frames))
        if self._sent_bytes - self.acked_bytes + size > self.max_bytes:
            self._dropped_full.inc()
            return False
        send = self._socket.send
        try:
            # The first part decides (HWM); the rest of a multipart message follows.
            for frame in frames[:-1]:
                send(frame, _MORE, copy=False)
            send(frames[-1], _LAST, copy=False)
        except zmq.Again:
            self._dropped_full.inc()
            return False
        except zmq.ZMQError:
            self._dropped_closed.inc()
            return False
        self._sent_bytes += size
        return True

    def open(self, route: Route, request_id: str, body: bytes, arrival_unix_ns: int,
             arrival_mono_ns: int, headers: bytes = b"",
             content_encoding: str = "") -> Capture | None:  # fmt: skip
        """Hand a request to the worker; returns the capture for its response,
        or None when the request could not be handed over (counted).

        ``body`` is the bytes the client sent (compressed if it sent them so);
        ``headers`` the allow-listed request headers (``channel.headers.pick``);
        ``content_encoding`` the body's header, for the worker to decode its copy.
        """
        key = hf.KEY.pack(self._next_key)
        self._next_key += 1
        meta = hf.REQUEST_META.pack(route, arrival_unix_ns, arrival_mono_ns, self._lost_requests)
        encoding = hf.pack_encoding(content_encoding)
        frames = [hf.KIND_REQUEST + key + meta, request_id.encode(), body, headers, encoding]
        if self._send(frames):
            return Capture(self, key, arrival_mono_ns, self.full_response)
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
    offset at which it was written to the client), then sends them as one
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
        "_arrival", "_bytes", "_chunks", "_full", "_handoff", "_head", "_key", "_lost", "_offsets",
    )  # fmt: skip

    def __init__(self, handoff: Handoff, key: bytes, arrival_mono_ns: int, full: bool):
        self._handoff = handoff
        self._key = key
        self._arrival = arrival_mono_ns
        self._full = full
        self._lost = False
        self._chunks: list[bytes] = []
        self._offsets: list[int] = []
        self._bytes = 0
        self._head = b""

    def head(self, status: int, content_type: str, content_encoding: str) -> None:
        """The response started; sent with the next chunk batch or the end."""
        offset = time.monotonic_ns() - self._arrival
        self._head = hf.pack_head(status, offset, content_type, content_encoding)

    def chunk(self, data: bytes) -> None:
        if self._lost:
            return
        chunks, offsets = self._chunks, self._offsets
        chunks.append(data)
        offsets.append(time.monotonic_ns() - self._arrival)
        if not self._full:
            if len(chunks) > self.TAIL_CHUNKS:
                del chunks[0], offsets[0]
            return
        self._bytes += len(data)
        if len(chunks) >= self.BATCH_CHUNKS or self._bytes >= self.BATCH_BYTES:
            index, data = hf.pack_chunks(offsets, chunks)
            frames = [hf.KIND_CHUNK + self._key, self._head, index, data]
            self._lost = not self._handoff._send(frames)
            self._head = b""
            chunks.clear()
            offsets.clear()
            self._bytes = 0

    def end(self, kind: EndKind, detail: str = "") -> None:
        if self._lost:
            kind = EndKind.CAPTURE_LOST
            self._chunks.clear()
            self._offsets.clear()
        meta = hf.END_META.pack(kind, time.monotonic_ns() - self._arrival)
        index, data = hf.pack_chunks(self._offsets, self._chunks)
        frames = [hf.KIND_END + self._key + meta, self._head, detail.encode(), index, data]
        self._handoff._send(frames)
