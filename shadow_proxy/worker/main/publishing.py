"""The tap worker's one authority over seqs: tap queues, publishers, checkpoints.

Runs in the worker's main process (``worker/main/loop.py``), the only process that
takes a tap's ``seq`` and sends on its socket. It is the ``RecordSink``
(``worker/sink.py``) behind every shard's outbox: the pool hands it each shard's
records and losses (``worker/messages.py``). So every record and every loss of a
tap passes here exactly once, whichever shard built it: ``next_seq = published +
dropped + publish_errors + queued`` per tap, and a consumer's gap accounting
holds as with one process.

Guarantees:
- a record is sent only once its seq is in the checkpoint file
  (``channel/checkpoint.py``), and each send is noted there as it happens (the
  tap's progress): when this process is killed, the serving process counts
  exactly the records it had not sent;
- each tap counts, per request handed over on this connection, when its fate on
  the tap is decided (``resolved``), for the same reason;
- a queued record older than ``worker.max_lag_s`` is dropped as ``late``;
- a heartbeat per tap every second, and for ``ANNOUNCE_S`` after start the last
  heartbeat of each dead predecessor (its final state, from the hello message).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import zmq
from prometheus_client import CollectorRegistry

from shadow_proxy.channel import checkpoint as cp
from shadow_proxy.channel.control import TapCounters, TapInfo
from shadow_proxy.channel.handoff import Hello
from shadow_proxy.config import Config, Transport
from shadow_proxy.exchange import DropReason
from shadow_proxy.records.wire import Heartbeat
from shadow_proxy.worker.lag import LagBound, LateStage, late_counter, record_lag_histogram
from shadow_proxy.worker.main.publishers import curve
from shadow_proxy.worker.main.publishers.zeromq import Publisher
from shadow_proxy.worker.main.tap_queue import TapQueues
from shadow_proxy.worker.sink import EncodedRecord

#: How long the last words of dead publishers are repeated (subscribers
#: reconnect to the new sockets within this).
ANNOUNCE_S = 10.0
#: How long the loop sleeps when it has queued records it could not send.
RETRY_MS = 5
#: Counters alone (no new seq to claim) are checkpointed at most this often.
CHECKPOINT_EVERY_S = 0.01


class TapSocketError(OSError):
    """A tap's socket cannot be bound; the message names the key's line."""


class Publishing:
    """Each tap's queue and publisher (its PUB socket, a CURVE server with keys, or
    its share of the JetStream ``link``), and the checkpoint of their state.
    Raises ``TapSocketError`` or ``curve.CurveKeyError`` naming the config line."""

    def __init__(
        self,
        config: Config,
        context: zmq.Context,
        registry: CollectorRegistry,
        *,
        generation: int = 0,
        checkpoint_path: str | Path | None = None,
        link: Any = None,
    ):
        self.config = config
        self.queues = TapQueues(config.taps)
        bound = LagBound.from_seconds(config.worker.max_lag_s)
        self.lag = record_lag_histogram(registry)
        self.late = late_counter(registry)
        self.publishers: list[Any] = []
        self._file: cp.CheckpointFile | None = None
        keys = curve.load_all(config)
        #: ZAP for the CURVE taps, in its own thread (see ``publishers/curve.py``).
        self.authenticator = curve.start_authenticator(context, keys)
        for index, queue in enumerate(self.queues):
            tap = queue.config
            if tap.transport is Transport.NATS:
                self.publishers.append(link.publisher(queue))
                continue
            try:
                publisher = Publisher(
                    context,
                    queue,
                    keys.get(tap.name),
                    lag=self.lag.labels(queue.name),
                    bound=bound,
                    late=self.late.labels(LateStage.QUEUE),
                    on_sent=functools.partial(self._sent, index),
                )
            except zmq.ZMQError as e:
                self.close()
                where = config.where(f"taps[{tap.name}].endpoint")
                msg = (
                    f"{where}: tap '{tap.name}' cannot bind {tap.endpoint} "
                    f"({zmq.strerror(e.errno or 0)})"
                )
                raise TapSocketError(msg) from e
            self.publishers.append(publisher)
        if link is not None:
            registry.register(link.metrics)
        self.all_taps = (1 << len(self.queues)) - 1
        #: Per tap: requests of this connection whose fate on the tap is decided.
        self.resolved = [0] * len(self.queues)
        #: Requests the serving loop could not hand over, counted so far.
        self.lost_seen = 0
        self.generation = generation
        self._claimed = [0] * len(self.queues)
        self._last_write = 0.0
        self._dirty = True
        if checkpoint_path is not None:
            self._file = cp.CheckpointFile(checkpoint_path, len(self.queues))
            self.checkpoint()
        self._tombstones: list[tuple[int, Heartbeat, int]] = []
        self._announce_until = 0.0

    # -- the RecordSink: what the shards publish ---------------------------------

    def record(self, tap: int, record: EncodedRecord, ready_mono_ns: int) -> None:
        """A record from a shard: its seq is taken here and written into it."""
        self.queues.record(tap, record, ready_mono_ns)
        self._dirty = True

    def drop(self, tap: int, reason: DropReason, count: int = 1) -> None:
        self.queues.drop(tap, reason, count)
        self._dirty = True

    def skip(self, tap: int, reason: str) -> None:
        self.queues.skip(tap, reason)
        self._dirty = True

    # -- what the pool counts ------------------------------------------------------

    def resolve(self, mask: int) -> None:
        """The taps in ``mask`` are decided for one more request."""
        tap = 0
        while mask:
            if mask & 1:
                self.resolved[tap] += 1
            mask >>= 1
            tap += 1
        self._dirty = True

    def drop_waiting(self, reason: DropReason, waiting: dict[int, int]) -> int:
        """The records a request still owed are lost: each a drop with its seq; the
        taps are decided. Returns how many records."""
        mask = 0
        for tap, count in waiting.items():
            self.queues[tap].drop(reason, count)
            mask |= 1 << tap
        self.resolve(mask)
        return sum(waiting.values())

    def drop_request(self, reason: DropReason, mask: int | None = None) -> None:
        """A request handed over on this connection is lost on the taps in ``mask``
        (all by default): each counts one drop, its seq taken, and is decided."""
        mask = self.all_taps if mask is None else mask
        for tap in range(len(self.queues)):
            if mask >> tap & 1:
                self.queues[tap].drop(reason)
        self.resolve(mask)

    def count_lost(self, lost_before: int) -> None:
        """Requests the serving loop could not hand over (from a ``q``'s meta)."""
        if lost_before > self.lost_seen:
            for queue in self.queues:
                queue.drop(DropReason.HANDOFF_FULL, lost_before - self.lost_seen)
            self.lost_seen = lost_before
            self._dirty = True

    def on_hello(self, hello: Hello) -> None:
        """The serving process's hello: the hand-off losses the dead predecessors
        already counted (this worker counts on from there), and their final states,
        announced on their publisher ids for ``ANNOUNCE_S``."""
        self.lost_seen = hello.lost_base
        self._dirty = True
        by_name = {queue.name: i for i, queue in enumerate(self.queues)}
        for state in hello.tombstones:
            tap = by_name.get(state.name)
            if tap is None:
                continue
            beat = Heartbeat(
                tap=state.name,
                publisher_id=state.publisher_id,
                next_seq=state.next_seq,
                last_transport_sequence=state.next_transport - 1 if state.next_transport else None,
                queued=state.queued,
                published=state.published,
                dropped={k: v for k, v in state.dropped.items() if v},
                publish_errors=state.publish_errors,
            )
            self._tombstones.append((tap, beat, state.heartbeats_sent + 1000))
        self._announce_until = time.monotonic() + ANNOUNCE_S

    # -- sending -------------------------------------------------------------------

    def checkpoint(self) -> None:
        if self._file is None:
            return
        taps = []
        for queue, publisher, resolved in zip(
            self.queues, self.publishers, self.resolved, strict=True
        ):
            taps.append(
                cp.TapState(
                    name=queue.name,
                    publisher_id=publisher.publisher_id,
                    next_seq=queue.next_seq,
                    resolved=resolved,
                    next_transport=getattr(publisher, "next_transport_sequence", 0),
                    heartbeats_sent=getattr(publisher, "heartbeats_sent", 0),
                    queued=queue.queued,
                    published=queue.published,
                    publish_errors=queue.publish_errors,
                    dropped=dict(queue.dropped),
                    skipped=dict(queue.skipped),
                )
            )
        self._file.write(cp.Checkpoint(self.generation, self.lost_seen, tuple(taps)))
        self._claimed = [queue.next_seq for queue in self.queues]
        self._last_write = time.monotonic()
        self._dirty = False

    def pump(self) -> bool:
        """Checkpoint what must be, send what the queues hold; True when records
        are still waiting (a subscriber's pipe is full)."""
        unclaimed = any(
            q.next_seq != claimed for q, claimed in zip(self.queues, self._claimed, strict=True)
        )
        if unclaimed or (self._dirty and time.monotonic() - self._last_write >= CHECKPOINT_EVERY_S):
            self.checkpoint()
        waiting = sent = False
        for publisher in self.publishers:
            queue = publisher.queue
            if queue.items:
                late = DropReason.LATE
                before = queue.published + queue.dropped[late] + queue.publish_errors
                waiting |= publisher.pump()
                sent |= queue.published + queue.dropped[late] + queue.publish_errors != before
        if sent:
            self._dirty = True
            self.checkpoint()
        return waiting

    def heartbeat(self) -> None:
        self.checkpoint()
        for publisher in self.publishers:
            publisher.heartbeat()
        if self._tombstones and time.monotonic() < self._announce_until:
            for tap, beat, sequence in self._tombstones:
                publisher = self.publishers[tap]
                if hasattr(publisher, "last_words"):  # ZeroMQ taps (JetStream: not yet)
                    publisher.last_words(beat, sequence)
        elif self._tombstones:
            self._tombstones = []

    def drain(self, deadline_s: float) -> int:
        """Publish what is queued for up to ``deadline_s``; returns what was lost."""
        deadline = time.monotonic() + deadline_s
        while (self.pump() or self.in_flight()) and time.monotonic() < deadline:
            time.sleep(RETRY_MS / 1000)
        lost = sum(queue.close() for queue in self.queues)
        self.checkpoint()
        return lost

    def in_flight(self) -> int:
        """Records handed to a transport and not yet confirmed (JetStream acks)."""
        return sum(publisher.in_flight for publisher in self.publishers)

    def close(self) -> None:
        for publisher in self.publishers:
            publisher.close()
        self.publishers = []
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def _sent(self, tap: int) -> None:
        """``tap``'s counters changed (a record about to be sent, failed or late):
        noted in the checkpoint's progress at once, not at the batch's end (a kill
        between the two would count a delivered record as lost)."""
        if self._file is not None:
            queue = self.queues[tap]
            publisher = self.publishers[tap]
            self._file.progress(
                tap,
                cp.Progress(
                    queue.published,
                    queue.publish_errors,
                    queue.dropped[DropReason.LATE],
                    publisher.next_transport_sequence,
                ),
            )

    def tap_info(self) -> tuple[TapInfo, ...]:
        """What ``/shadow/taps`` shows of each tap that does not change (``Ready``)."""
        return tuple(
            TapInfo(
                name=tap.name,
                topic=tap.topic,
                endpoint=publisher.endpoint,
                capture=tap.capture,
                curve=tap.curve is not None,
                filters=tuple(tap.filters.names),
                models=tap.models,
                sample=tap.sample,
                capacity=tap.capacity,
                transport=tap.transport,
                publisher_id=publisher.publisher_id,
                subject=tap.subject,
            )
            for publisher in self.publishers
            for tap in (publisher.queue.config,)
        )

    def tap_counters(self) -> tuple[TapCounters, ...]:
        """Each tap's counters now (every ``Snapshot``)."""
        return tuple(
            TapCounters(
                next_seq=queue.next_seq,
                queued=queue.queued,
                published=queue.published,
                dropped=dict(queue.dropped),
                skipped=dict(queue.skipped),
                publish_errors=queue.publish_errors,
                queue_depth=len(queue.items),
            )
            for queue in self.queues
        )
