"""One ``nats`` tap's side of the JetStream link: its hand-over and its ack window.

``jetstream.py`` says how the two threads share the work; this is the per-tap
state. ``pump``, ``heartbeat`` and ``close`` run on the worker's thread; the
rest on the link's thread. The hand-over deque and the counters are the only
state both touch, and each counter has one writer.
"""

from __future__ import annotations

import collections
import heapq
import json
import threading
import time
from typing import Protocol

import attrs
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from shadow_proxy.config import NatsConfig
from shadow_proxy.records.wire import HEARTBEAT_SUFFIX, Heartbeat, new_publisher_id
from shadow_proxy.worker.main.publishers.jetstream_metrics import TapStats
from shadow_proxy.worker.main.tap_queue import TapQueue


class Link(Protocol):
    """What a tap needs of the link it publishes through (``jetstream.JetStreamLink``)."""

    config: NatsConfig

    def wake(self) -> None:
        """Called from the worker's thread: the link has records to take."""

    def note(self, message: str, *args: object) -> None:
        """Log a problem, rate-limited."""

    def release(self, publisher: JetStreamPublisher) -> None:
        """The tap is closed; the last one stops the link."""


ACK_TIMEOUT_S = 2.0
RETRY_MAX_S = 10.0
HEARTBEAT_S = 10.0


def ack_timeout(attempt: int) -> float:
    """How long attempt ``attempt`` (1 = the first send) waits before a resend."""
    return min(ACK_TIMEOUT_S * 2 ** (attempt - 1), RETRY_MAX_S)


@attrs.define
class InFlight:
    """A record handed to the link and not yet acknowledged."""

    payload: bytes
    handed_at: float
    transport_sequence: int
    attempt: int = 0
    #: Waiting in ``unsent`` (first send, or a resend that is due).
    queued: bool = True


class JetStreamPublisher:
    """One ``nats`` tap; the worker's side is ``pump``/``heartbeat``/``close``."""

    def __init__(self, link: Link, queue: TapQueue, index: int):
        config = queue.config
        self.link = link
        self.queue = queue
        self.index = index
        self.capacity = config.capacity
        if config.subject is None:
            raise ValueError(f"tap '{config.name}' publishes to NATS without a subject")
        self.subject: str = config.subject
        self.heartbeat_subject = config.subject + HEARTBEAT_SUFFIX
        self.publisher_id = new_publisher_id()
        self.endpoint = f"jetstream://{link.config.stream}/{config.subject}"
        self.stats = TapStats(config.name)
        #: Records handed to the link: payload and seq.
        self.handover: collections.deque[tuple[bytes, int]] = collections.deque()
        #: Written by the worker thread only.
        self.handed = 0
        self.next_heartbeat = 0.0
        self.last_state: tuple | None = None
        #: Written by the link thread only (and the queue's ``published`` and
        #: ``publish_errors``, which no one else writes for a JetStream tap).
        self.settled = 0
        #: Dense, per publisher: taken when the link takes a record over, so a
        #: gap in it is a record lost after the hand-over (SPEC 4's transport
        #: sequence, sent as ``Shadow-Transport-Seq``).
        self.next_transport_sequence = 0
        self.window: dict[int, InFlight] = {}
        self.unsent: collections.deque[int] = collections.deque()
        self.timeouts: list[tuple[float, int, int]] = []
        self.headers = {
            "Shadow-Tap": config.name,
            "Shadow-Publisher-Id": str(self.publisher_id),
            "Nats-Expected-Stream": link.config.stream,
        }
        self.heartbeat_lock = threading.Lock()
        self.heartbeat_payload: bytes | None = None

    # -- the worker's thread -----------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Records handed to the link and not settled (acknowledged or given up)."""
        return self.handed - self.settled

    def pump(self) -> bool:
        """Hand queued records over while the window has room; never waits.
        True when records are still waiting in the tap's queue."""
        items = self.queue.items
        room = min(self.capacity - (self.handed - self.settled), len(items))
        if room > 0:
            handover, queue = self.handover, self.queue
            for _ in range(room):
                payload, _, seq = queue.popleft()
                handover.append((payload, seq))
            self.handed += room
            self.link.wake()
        return bool(items)

    def heartbeat(self, force: bool = False) -> None:
        """Every ``HEARTBEAT_S``, when the tap's numbers changed, queue a heartbeat."""
        now = time.monotonic()
        queue = self.queue
        state: tuple[int, ...] = (
            queue.next_seq,
            queue.queued,
            queue.published,
            queue.publish_errors,
        )
        state += tuple(queue.dropped.values())
        if not force and (now < self.next_heartbeat or state == self.last_state):
            return
        self.next_heartbeat, self.last_state = now + HEARTBEAT_S, state
        payload = Heartbeat(
            tap=queue.name,
            publisher_id=self.publisher_id,
            next_seq=queue.next_seq,
            last_transport_sequence=self.next_transport_sequence - 1
            if self.next_transport_sequence
            else None,
            queued=queue.queued,
            published=queue.published,
            dropped={k: v for k, v in queue.dropped.items() if v},
            publish_errors=queue.publish_errors,
        ).encode()
        with self.heartbeat_lock:
            self.heartbeat_payload = payload
        self.link.wake()

    def close(self) -> None:
        """The last tap to close stops the link (which settles what is left)."""
        self.heartbeat(force=True)
        self.link.release(self)

    # -- the link's thread -------------------------------------------------------

    def take_handover(self, now: float) -> None:
        handover = self.handover
        while handover:
            payload, seq = handover.popleft()
            transport_sequence = self.next_transport_sequence
            self.next_transport_sequence += 1
            self.window[seq] = InFlight(payload, now, transport_sequence)
            self.unsent.append(seq)

    def expire(self, now: float) -> None:
        """Records whose acknowledgement is overdue go back to ``unsent``."""
        timeouts = self.timeouts
        while timeouts and timeouts[0][0] <= now:
            _, seq, attempt = heapq.heappop(timeouts)
            flight = self.window.get(seq)
            if flight is not None and flight.attempt == attempt and not flight.queued:
                flight.queued = True
                self.unsent.append(seq)

    def resend_all(self) -> None:
        """A new connection: what was in flight on the old one is sent again."""
        for seq, flight in self.window.items():
            if not flight.queued:
                flight.queued = True
                self.unsent.append(seq)

    async def send(self, nc: NATS, reply_prefix: str, now: float) -> None:
        prefix = f"{self.publisher_id}.{self.stats.tap}."
        while self.unsent and nc.is_connected:
            seq = self.unsent.popleft()
            flight = self.window.get(seq)
            if flight is None or not flight.queued:
                continue
            headers = {
                **self.headers,
                "Nats-Msg-Id": prefix + str(seq),
                "Shadow-Seq": str(seq),
                "Shadow-Transport-Seq": str(flight.transport_sequence),
            }
            try:
                await nc.publish(
                    self.subject, flight.payload, reply=f"{reply_prefix}{seq}", headers=headers
                )
            except NatsError as e:
                self.queue.publish_errors += 1
                self.link.note("publish failed: %s", type(e).__name__)
                self.unsent.appendleft(seq)
                return
            flight.queued = False
            flight.attempt += 1
            if flight.attempt > 1:
                self.stats.retries += 1
            due = now + ack_timeout(flight.attempt)
            heapq.heappush(self.timeouts, (due, seq, flight.attempt))

    def on_reply(self, seq: int, msg: Msg, now: float) -> bool:
        """Settle ``seq`` on an acknowledgement. False when the stream is missing."""
        flight = self.window.get(seq)
        if flight is None:
            return True  # a late answer to an earlier attempt of a settled record
        if msg.headers and msg.headers.get("Status") == "503":
            self.queue.publish_errors += 1
            return False
        try:
            answer = json.loads(msg.data)
        except ValueError:
            answer = {"error": {"description": "not JSON"}}
        error = answer.get("error") if isinstance(answer, dict) else {"description": "not a map"}
        if error:
            self.queue.publish_errors += 1
            self.link.note("publish refused: %s", str(error.get("description", error))[:200])
            return True  # resent when its acknowledgement timeout passes
        del self.window[seq]
        self.settled += 1
        self.queue.published += 1
        self.stats.ack_seconds.observe(max(0.0, now - flight.handed_at))
        return True

    def take_heartbeat(self) -> bytes | None:
        with self.heartbeat_lock:
            payload, self.heartbeat_payload = self.heartbeat_payload, None
        return payload

    def leftovers(self) -> tuple[int, int]:
        """(never sent, sent and not acknowledged) among the records still held."""
        never = len(self.handover) + sum(1 for f in self.window.values() if f.attempt == 0)
        return never, len(self.window) + len(self.handover) - never
