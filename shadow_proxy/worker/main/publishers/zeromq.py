"""One publisher per tap: its own PUB socket, the SPEC framing, heartbeats.

The socket is an XPUB (a PUB that subscribers cannot tell apart) with
``XPUB_NODROP``: when a subscriber's pipe is at the high-water mark (equal to
the tap's capacity), a send fails with ``EAGAIN`` instead of ZeroMQ dropping
the message silently. The record then stays in the tap's queue, the queue
fills, and new records are dropped and counted as ``full``: every loss is
counted by the proxy, none hides in ZeroMQ. LINGER is bounded so that closing
never hangs on a stalled consumer.

Each record sent has its lag observed (``worker/lag.py``); a queued record
older than ``worker.max_lag_s`` is dropped as ``late`` instead of sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from shadow_proxy.exchange import DropReason
from shadow_proxy.records.wire import Heartbeat, encode_frames, heartbeat_topic, new_publisher_id
from shadow_proxy.worker.lag import LagBound
from shadow_proxy.worker.main.publishers.curve import TapKeys, make_server
from shadow_proxy.worker.main.tap_queue import TapQueue

log = logging.getLogger(__name__)

LINGER_MS = 200


class Publisher:
    #: Records sent and not yet confirmed: none, a ZeroMQ send is final.
    in_flight = 0

    def __init__(
        self,
        context: zmq.Context,
        queue: TapQueue,
        keys: TapKeys | None = None,
        *,
        lag: Any = None,
        bound: LagBound | None = None,
        late: Any = None,
        on_sent: Callable[[], None] | None = None,
    ):
        """Bind the tap's socket; with ``keys`` as a CURVE server (``curve.py``).
        ``on_sent`` is called each time the counters change, after they do: a
        record about to be sent (counted first, taken back if the send fails),
        failed, or dropped late."""
        config = queue.config
        self.queue = queue
        #: The tap's lag histogram child, the late bound and the late counter child.
        self.lag = lag
        self.bound = bound or LagBound(None)
        self.late = late
        self.on_sent = on_sent
        self.topic = config.topic
        self.heartbeat_topic = heartbeat_topic(config.topic)
        self.publisher_id = new_publisher_id()
        self.next_transport_sequence = 0
        self.heartbeats_sent = 0
        self.socket = context.socket(zmq.XPUB)
        self.socket.setsockopt(zmq.SNDHWM, config.capacity)
        self.socket.setsockopt(zmq.RCVHWM, 1000)
        self.socket.setsockopt(zmq.LINGER, LINGER_MS)
        self.socket.setsockopt(zmq.XPUB_NODROP, 1)
        if keys is not None:
            make_server(self.socket, config.name, keys)
        self.socket.bind(config.endpoint)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def pump(self) -> bool:
        """Send queued records until the queue is empty or the socket would
        block. Returns True when records are still waiting."""
        queue = self.queue
        items = queue.items
        socket = self.socket
        bound, lag = self.bound, self.lag
        on_sent = self.on_sent
        now = time.monotonic_ns()
        while items:
            ready = queue.ready[0] if queue.ready else 0
            if ready and bound.late(ready, now):
                queue.popleft()
                queue.dropped[DropReason.LATE] += 1
                if self.late is not None:
                    self.late.inc()
                if on_sent is not None:
                    on_sent()
                continue
            frames = encode_frames(
                self.topic,
                self.publisher_id,
                self.next_transport_sequence,
                time.time_ns() // 1_000_000,
                items[0],
            )
            # Counted sent before the send: a kill between a send and its note
            # would make a delivered record a lost one. Noted first, a kill
            # before the send leaves a record noted and never sent, which a
            # consumer sees as a gap below the announced last transport sequence.
            self.next_transport_sequence += 1
            queue.published += 1
            if on_sent is not None:
                on_sent()
            try:
                socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as e:
                self.next_transport_sequence -= 1
                queue.published -= 1
                if isinstance(e, zmq.Again):
                    if on_sent is not None:
                        on_sent()
                    return True
                queue.popleft()
                queue.publish_errors += 1
                log.warning("tap %s: publish failed: %s", queue.name, e.strerror)
                if on_sent is not None:
                    on_sent()
                continue
            queue.popleft()
            if lag is not None and ready:
                lag.observe((now - ready) / 1e9)
        return False

    def drain_subscriptions(self) -> None:
        """Read (and discard) subscription messages so they never pile up (at most
        the socket's RCVHWM of them wait): once a heartbeat, not after every
        send (a subscriber's arrival or departure is one message; an empty
        pipe's read costs a ``zmq.Again`` raised and caught)."""
        socket = self.socket
        try:
            while True:
                socket.recv(flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def heartbeat(self) -> None:
        """Send the tap's state on ``{topic}.heartbeat``; a full pipe skips it."""
        self.drain_subscriptions()
        queue = self.queue
        last = self.next_transport_sequence - 1 if self.next_transport_sequence else None
        beat = Heartbeat(
            tap=queue.name,
            publisher_id=self.publisher_id,
            next_seq=queue.next_seq,
            last_transport_sequence=last,
            queued=queue.queued,
            published=queue.published,
            dropped={k: v for k, v in queue.dropped.items() if v},
            publish_errors=queue.publish_errors,
        )
        if self._send_heartbeat(beat, self.heartbeats_sent):
            self.heartbeats_sent += 1

    def last_words(self, beat: Heartbeat, sequence: int) -> None:
        """A dead predecessor's final heartbeat (its publisher id, its final
        ``next_seq`` and counters), sent on its behalf: consumers see the records
        it lost as that publisher's tail loss (``channel/checkpoint.py``)."""
        self._send_heartbeat(beat, sequence)

    def _send_heartbeat(self, beat: Heartbeat, sequence: int) -> bool:
        frames = encode_frames(
            self.heartbeat_topic,
            beat.publisher_id,
            sequence,
            time.time_ns() // 1_000_000,
            beat.encode(),
        )
        try:
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        return True

    def close(self) -> None:
        self.socket.close(linger=LINGER_MS)
