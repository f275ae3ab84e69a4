"""One publisher per tap: its own PUB socket, the SPEC framing, heartbeats.

The socket is an XPUB (a PUB that subscribers cannot tell apart) with
``XPUB_NODROP``: when a subscriber's pipe is at the high-water mark (equal to
the tap's capacity), a send fails with ``EAGAIN`` instead of ZeroMQ dropping
the message silently. The record then stays in the tap's queue, the queue
fills, and new records are dropped and counted as ``full``: every loss is
counted by the proxy, none hides in ZeroMQ. LINGER is bounded so that closing
never hangs on a stalled consumer.
"""

from __future__ import annotations

import logging
import time

import zmq

from shadow_proxy.records.wire import Heartbeat, encode_frames, heartbeat_topic, new_publisher_id
from shadow_proxy.worker.publishers.curve import TapKeys, make_server
from shadow_proxy.worker.tap_queue import TapQueue

log = logging.getLogger(__name__)

LINGER_MS = 200


class Publisher:
    #: Records sent and not yet confirmed: none, a ZeroMQ send is final.
    in_flight = 0

    def __init__(self, context: zmq.Context, queue: TapQueue, keys: TapKeys | None = None):
        """Bind the tap's socket; with ``keys`` as a CURVE server (``curve.py``)."""
        config = queue.config
        self.queue = queue
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
        items = self.queue.items
        socket = self.socket
        while items:
            frames = encode_frames(
                self.topic,
                self.publisher_id,
                self.next_transport_sequence,
                time.time_ns() // 1_000_000,
                items[0],
            )
            try:
                socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            except zmq.ZMQError as e:
                items.popleft()
                self.queue.publish_errors += 1
                log.warning("tap %s: publish failed: %s", self.queue.name, e.strerror)
                continue
            items.popleft()
            self.next_transport_sequence += 1
            self.queue.published += 1
        self.drain_subscriptions()
        return False

    def drain_subscriptions(self) -> None:
        """Read (and discard) subscription messages so they never pile up."""
        socket = self.socket
        try:
            while True:
                socket.recv(flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def heartbeat(self) -> None:
        """Send the tap's state on ``{topic}.heartbeat``; a full pipe skips it."""
        queue = self.queue
        last = self.next_transport_sequence - 1 if self.next_transport_sequence else None
        payload = Heartbeat(
            tap=queue.name,
            publisher_id=self.publisher_id,
            next_seq=queue.next_seq,
            last_transport_sequence=last,
            queued=queue.queued,
            published=queue.published,
            dropped={k: v for k, v in queue.dropped.items() if v},
            publish_errors=queue.publish_errors,
        ).encode()
        frames = encode_frames(
            self.heartbeat_topic,
            self.publisher_id,
            self.heartbeats_sent,
            time.time_ns() // 1_000_000,
            payload,
        )
        try:
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
            self.heartbeats_sent += 1
        except zmq.ZMQError:
            pass

    def close(self) -> None:
        self.socket.close(linger=LINGER_MS)
