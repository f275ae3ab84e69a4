"""The tap worker process: sockets and the loop around the join.

Spawned by the serving process (``serving/supervisor.py`` names this module's
``run`` by its import path, so the serving side never imports the worker).
One thread, one loop:

1. read hand-off messages from the PULL socket, in batches, into the
   ``Joiner`` (which preprocesses, joins and offers records to tap queues);
2. pump each tap's queue into its publisher;
3. every 50 ms while busy, tell the serving process how many hand-off bytes
   were read (its credit for the byte bound); every second, send heartbeats
   and a metrics snapshot.

Guarantees: a failure while handling one message is caught, counted by type
and logged without its text; it costs that message only. At SIGTERM the worker
reads what the serving loop sent up to its last message, gives open requests
their ``shutdown`` records, drains the queues for up to ``control.DRAIN_S`` and says
what it could not publish.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import zmq

from shadow_proxy.channel import control
from shadow_proxy.channel import frames as hf
from shadow_proxy.config import Config
from shadow_proxy.worker.joiner import Joiner
from shadow_proxy.worker.publishers import curve
from shadow_proxy.worker.publishers.zeromq import Publisher
from shadow_proxy.worker.request.tokenizer import LoadedModel, ModelLoadError, load_model

log = logging.getLogger(__name__)

#: Messages read from the hand-off per loop turn before the queues are pumped.
BATCH = 512
#: How long the loop sleeps when it has queued records it could not send.
RETRY_MS = 5
HEARTBEAT_S = 1.0
#: How often the worker tells the serving loop how many hand-off bytes it read.
PROGRESS_S = 0.05
#: At shutdown, how long the worker waits for the serving loop's last message.
LAST_MESSAGE_WAIT_S = 1.0


class Publishing:
    """Each tap's publisher, fed from the joiner's tap queues: its PUB socket, or
    its share of the JetStream link (``link``, when a tap uses NATS)."""

    def __init__(self, joiner: Joiner, context: zmq.Context, link: Any = None):
        self.joiner = joiner
        self.publishers: list[Any] = []
        keys = curve.load_all(joiner.config)
        #: ZAP for the CURVE taps, in its own thread (see ``publishers/curve.py``).
        self.authenticator = curve.start_authenticator(context, keys)
        for tap in joiner.taps:
            if tap.config.transport == "nats":
                self.publishers.append(link.publisher(tap.queue))
                continue
            try:
                self.publishers.append(Publisher(context, tap.queue, keys.get(tap.config.name)))
            except zmq.ZMQError as e:
                self.close()
                name, endpoint = tap.config.name, tap.config.endpoint
                where = joiner.config.where(f"taps[{name}].endpoint")
                msg = f"{where}: tap '{name}' cannot bind {endpoint} ({zmq.strerror(e.errno)})"
                raise TapSocketError(msg) from e
        if link is not None:
            joiner.metrics.registry.register(link.metrics)

    def pump(self) -> bool:
        """Send what the queues hold; True when records are still waiting."""
        waiting = False
        for publisher in self.publishers:
            if publisher.queue.items:
                waiting |= publisher.pump()
            else:
                publisher.drain_subscriptions()
        return waiting

    def heartbeat(self) -> None:
        for publisher in self.publishers:
            publisher.heartbeat()

    def drain(self, deadline_s: float) -> int:
        """Publish what is queued for up to ``deadline_s``; returns what was lost."""
        deadline = time.monotonic() + deadline_s
        while (self.pump() or self.in_flight()) and time.monotonic() < deadline:
            time.sleep(RETRY_MS / 1000)
        return sum(publisher.queue.close() for publisher in self.publishers)

    def in_flight(self) -> int:
        """Records handed to a transport and not yet confirmed (JetStream acks)."""
        return sum(publisher.in_flight for publisher in self.publishers)

    def close(self) -> None:
        for publisher in self.publishers:
            publisher.close()
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None

    def listing(self) -> list[dict]:
        """What ``/shadow/taps`` shows of each tap."""
        listing = []
        for tap, publisher in zip(self.joiner.taps, self.publishers, strict=True):
            config, queue = tap.config, tap.queue
            listing.append(
                {
                    "name": config.name,
                    "topic": config.topic,
                    "endpoint": publisher.endpoint,
                    "capture": config.capture,
                    "curve": config.curve is not None,
                    "filters": list(config.filters.names),
                    "models": list(config.models),
                    "sample": config.sample,
                    "capacity": config.capacity,
                    "transport": config.transport,
                    **({"subject": config.subject} if config.subject else {}),
                    "publisher_id": publisher.publisher_id,
                    "next_seq": queue.next_seq,
                    "queued": queue.queued,
                    "published": queue.published,
                    "dropped": dict(queue.dropped),
                    "skipped": dict(queue.skipped),
                    "publish_errors": queue.publish_errors,
                    "queue_depth": len(queue.items),
                }
            )
        return listing


class TapSocketError(OSError):
    """A tap's socket cannot be bound; the message names the key's line."""


def _jetstream_link(config: Config) -> Any:
    """The JetStream link when a tap publishes to NATS (None otherwise); it starts
    connecting now, while the tokenizers load. Imported only then: a worker
    without NATS taps does not load nats-py."""
    if not any(tap.transport == "nats" for tap in config.taps):
        return None
    from shadow_proxy.worker.publishers.jetstream import JetStreamLink

    return JetStreamLink.for_config(config)


def _load_models(config: Config) -> dict[str, LoadedModel]:
    models = {}
    for index, entry in enumerate(config.models):
        try:
            models[entry.name] = load_model(
                entry.name,
                entry.tokenizer,
                entry.context_length,
                template_engine=entry.template_engine,
            )
        except ModelLoadError as e:
            msg = f"{config.where(f'models[{index}].tokenizer')}: {e}"
            raise ModelLoadError(msg) from e
    return models


def run(config: Config, handoff_endpoint: str, control_endpoint: str) -> int:
    """The worker process's main: load, say ready (or why not), loop until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s worker: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the serving process decides when to stop
    if config.worker.nice:
        os.nice(config.worker.nice)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))

    context = zmq.Context()
    control_socket = context.socket(zmq.PUSH)
    control_socket.setsockopt(zmq.LINGER, 1000)
    control_socket.setsockopt(zmq.SNDHWM, 16)
    control_socket.connect(control_endpoint)

    def say(message: control.ControlMessage) -> bool:
        try:
            control_socket.send(control.encode(message), flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    link = _jetstream_link(config)
    try:
        joiner = Joiner(config, _load_models(config))
        publishing = Publishing(joiner, context, link)
        problem = link.startup_problem() if link is not None else None
    except (ModelLoadError, TapSocketError, curve.CurveKeyError) as e:
        problem = str(e)
    if problem is not None:
        say(control.Failed(problem))
        if link is not None:
            link.close()
        control_socket.close(linger=1000)
        context.term()
        return 1

    pull = context.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, config.worker.handoff_capacity)
    pull.setsockopt(zmq.LINGER, 0)
    pull.connect(handoff_endpoint)
    say(control.Ready(publishing.listing()))

    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    next_beat = time.monotonic() + HEARTBEAT_S
    next_progress = 0.0
    received = reported = 0  # hand-off bytes read, and last said (the serving side's credit)
    waiting = False
    while not stop["now"]:
        timeout_ms = RETRY_MS if waiting else max(0, (next_beat - time.monotonic()) * 1000)
        if reported != received:
            timeout_ms = min(timeout_ms, PROGRESS_S * 1000)
        if poller.poll(timeout_ms):
            for _ in range(BATCH):
                try:
                    frames = pull.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                received += sum(map(len, frames))
                handle_safely(joiner, frames)
        waiting = publishing.pump()
        now = time.monotonic()
        if received != reported and now >= next_progress and say(control.Progress(received)):
            reported, next_progress = received, now + PROGRESS_S
        if now >= next_beat:
            next_beat = now + HEARTBEAT_S
            publishing.heartbeat()
            say(control.Snapshot(joiner.metrics.snapshot(), publishing.listing(), received))

    # Shutdown: what the serving loop sent before it stopped (up to its last
    # message, which may still be in transit), then the queues.
    deadline = time.monotonic() + LAST_MESSAGE_WAIT_S
    while time.monotonic() < deadline:
        if not pull.poll(50):
            continue
        frames = pull.recv_multipart()
        if frames[0][:1] == hf.KIND_LAST:
            break
        handle_safely(joiner, frames)
    joiner.finish_pending()
    lost = publishing.drain(control.DRAIN_S)
    publishing.heartbeat()
    say(control.Snapshot(joiner.metrics.snapshot(), publishing.listing()))
    if lost:
        log.warning(
            "shutdown: %d queued record(s) lost after the %.0fs drain", lost, control.DRAIN_S
        )
    publishing.close()
    pull.close()
    control_socket.close(linger=1000)
    context.term()
    return 0


def handle_safely(joiner: Joiner, frames: list[bytes]) -> None:
    """A malformed message or a bug in one record costs that record only. The
    log line names the exception type and where it was raised, never its
    message (which could quote client text)."""
    try:
        joiner.handle(frames)
    except Exception as e:  # a bug in a record's building must not stop the worker
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        kind = type(e)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        joiner.metrics.failures.labels(name).inc()
        log.error("hand-off message dropped: %s at %s", name, where)
