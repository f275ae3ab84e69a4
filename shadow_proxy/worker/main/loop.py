"""The tap worker's main process: the hand-off in, the shards, the tap sockets out.

Spawned by the serving process (``serving/supervisor.py`` names this module's
``run`` by its import path for ``lifeline.spawn``, so the serving side never
imports the worker; the worker dies with it).
One thread, one loop, and none of the CPU-heavy work, which is the shards'
(``worker/main/pool.py``, ``worker/shard/loop.py``): whatever one request costs, the
main keeps its one-second heartbeats.

1. read the hand-off (the Unix socket the serving process listens on) and
   route each message to the shard that holds its request;
2. read what the shards send (``worker/messages.py``): records (their seq
   taken here), losses, settles, metrics;
3. checkpoint the taps' state and send what their queues hold
   (``worker/main/publishing.py``);
4. every second: heartbeats, and a ``Snapshot`` (the metrics of the shards and
   the main combined, the taps' counters) to the serving process
   (``channel/control.py``); what does not change went once, in ``Ready``.

Every process of the worker (this one and each shard) runs in the idle
scheduling class once ready (``worker.priority``), so the serving loop always
comes first. At SIGTERM the main reads what the serving loop sent up to its
last message, has the shards finish their open requests as ``shutdown``
records, drains the queues for up to ``control.DRAIN_S`` and says what it could
not publish. When the serving process's socket closes without a last message
(it died), the main and its shards exit.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import time
from typing import Any

import zmq
from prometheus_client import CollectorRegistry

from shadow_proxy.channel import control
from shadow_proxy.channel.families import Family, snapshot
from shadow_proxy.channel.handoff import Hello, Kind, decode, peek
from shadow_proxy.channel.stream import StreamDecoder, split_frames
from shadow_proxy.config import Config, Priority, Transport
from shadow_proxy.worker import priority
from shadow_proxy.worker.main.metrics import TapMetrics
from shadow_proxy.worker.main.pool import Pool
from shadow_proxy.worker.main.publishers import curve
from shadow_proxy.worker.main.publishing import RETRY_MS, Publishing, TapSocketError
from shadow_proxy.worker.main.shards import default_processes

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
#: At shutdown, how long the worker waits for the serving loop's last message.
LAST_MESSAGE_WAIT_S = 1.0
#: How long the shards may take to load their models.
SHARDS_READY_S = 110.0
#: At shutdown, how long the shards may take to finish what they were sent.
SHARDS_STOP_S = 2.0
#: Hand-off bytes read per loop turn before the shards and queues get their turn.
READ_PER_TURN = 4 << 20
#: At shutdown, how long the last snapshot may wait for room on the control socket.
LAST_SNAPSHOT_WAIT_S = 1.0


class Main:
    """The loop's state: the hand-off socket, the pool, the publishing."""

    def __init__(
        self, config: Config, publishing: Publishing, pool: Pool, registry: CollectorRegistry
    ):
        self.config = config
        self.publishing = publishing
        self.pool = pool
        self.registry = registry
        self.handoff: socket.socket | None = None
        self.decoder = StreamDecoder()
        self.last_seen = False
        self.parent_gone = False

    def connect(self, path: str) -> None:
        """Connect to the serving process and read its hello (what dead
        predecessors left to announce)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.settimeout(30)
        messages: list[bytes] = []
        while not messages:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the serving process closed the hand-off")
            messages = self.decoder.feed(data)
        hello = decode(split_frames(messages[0]))
        if not isinstance(hello, Hello):
            raise ConnectionError("the hand-off did not start with a hello")
        self.publishing.on_hello(hello)
        sock.setblocking(False)
        self.handoff = sock
        for message in messages[1:]:
            self.route(message)

    def route(self, message: bytes) -> None:
        if peek(message)[0] == Kind.LAST.value:
            self.last_seen = True
            return
        self.pool.route(message)

    def read_handoff(self) -> None:
        handoff = self.handoff
        if handoff is None:
            return
        got = 0
        while got < READ_PER_TURN and not self.last_seen:
            try:
                data = handoff.recv(1 << 20)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.parent_gone = True
                return
            got += len(data)
            for message in self.decoder.feed(data):
                self.route(message)

    def poll(self, timeout_ms: float) -> None:
        """Wait for input up to ``timeout_ms``, then handle what came."""
        poller = select.poll()
        handoff_fd = -1
        if self.handoff is not None and not self.last_seen and not self.parent_gone:
            handoff_fd = self.handoff.fileno()
            poller.register(handoff_fd, select.POLLIN)
        listener_fd = self.pool.listener.fileno()
        poller.register(listener_fd, select.POLLIN)
        for fd, wants_write in self.pool.fds():
            poller.register(fd, select.POLLIN | (select.POLLOUT if wants_write else 0))
        for fd, _ in poller.poll(timeout_ms):
            if fd == handoff_fd:
                self.read_handoff()
            elif fd == listener_fd:
                self.pool.accept()
            else:
                self.pool.readable(fd)
        self.pool.flush()
        self.pool.tick()

    def families(self) -> list[Family]:
        """The main's metrics and its shards', combined (``channel/families.py``)."""
        totals = self.pool.totals
        totals.update("main", snapshot(self.registry))
        return totals.families()


def _jetstream_link(config: Config) -> Any:
    """The JetStream link when a tap publishes to NATS (None otherwise); it starts
    connecting now, while the shards load the tokenizers. Imported only then: a
    worker without NATS taps does not load nats-py."""
    if not any(tap.transport is Transport.NATS for tap in config.taps):
        return None
    from shadow_proxy.worker.main.publishers.jetstream import JetStreamLink

    return JetStreamLink.for_config(config)


def run(
    config: Config,
    handoff_path: str,
    control_endpoint: str,
    checkpoint_path: str | None = None,
    generation: int = 0,
) -> int:
    """The worker's main: start the shards and tap sockets, say ready (or why
    not), loop until SIGTERM or the serving process is gone."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s worker: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the serving process decides when to stop
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))

    context = zmq.Context()
    control_socket = context.socket(zmq.PUSH)
    control_socket.setsockopt(zmq.LINGER, 1000)
    control_socket.setsockopt(zmq.SNDHWM, 16)
    control_socket.connect(control_endpoint)

    def say(message: control.ControlMessage, wait_s: float = 0.0) -> bool:
        """Send without blocking the loop; a snapshot the serving process has no
        room for is superseded by the next one (absolute values). The last one
        waits up to ``wait_s``."""
        if wait_s and not control_socket.poll(int(wait_s * 1000), zmq.POLLOUT):
            return False
        try:
            control_socket.send(control.encode(message), flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    link = _jetstream_link(config)

    def fail(message: str) -> int:
        say(control.Failed(message))
        if link is not None:
            link.close()
        control_socket.close(linger=1000)
        context.term()
        return 1

    registry = CollectorRegistry()
    try:
        publishing = Publishing(
            config,
            context,
            registry,
            generation=generation,
            checkpoint_path=checkpoint_path,
            link=link,
        )
    except (TapSocketError, curve.CurveKeyError) as e:
        return fail(str(e))
    registry.register(TapMetrics(publishing.queues.queues))
    processes = config.worker.processes or default_processes()
    pool = Pool(config, publishing, os.path.dirname(handoff_path), registry, processes)
    pool.start()
    main = Main(config, publishing, pool, registry)
    deadline = time.monotonic() + SHARDS_READY_S
    while not pool.all_ready() and pool.failure is None and time.monotonic() < deadline:
        if stop["now"]:
            break
        main.poll(100)
    problem = link.startup_problem() if link is not None else None
    if not pool.all_ready() or problem is not None:
        pool.stop(0)
        publishing.close()
        why = problem or pool.failure
        return fail(why or f"the tap worker's shards were not ready in {SHARDS_READY_S:.0f}s")
    try:
        main.connect(handoff_path)
    except OSError as e:
        pool.stop(0)
        publishing.close()
        return fail(f"hand-off: {e}")
    achieved = priority.lower_priority(
        fallback_nice=config.worker.nice, idle=config.worker.priority is Priority.IDLE
    )
    if achieved.fallback_reason:
        why = achieved.fallback_reason
        log.warning("the tap worker runs at nice %d: %s", config.worker.nice, why)
    say(control.Ready(publishing.tap_info()))

    next_beat = time.monotonic() + HEARTBEAT_S
    waiting = False
    while not stop["now"] and not main.parent_gone:
        timeout_ms = RETRY_MS if waiting else max(0, (next_beat - time.monotonic()) * 1000)
        main.poll(timeout_ms)
        waiting = publishing.pump()
        now = time.monotonic()
        if now >= next_beat:
            next_beat = now + HEARTBEAT_S
            publishing.heartbeat()
            say(control.Snapshot(generation, main.families(), publishing.tap_counters()))

    # Shutdown: what the serving loop sent before it stopped (up to its last
    # message, which may still be in transit), then the shards' open requests,
    # then the queues.
    deadline = time.monotonic() + LAST_MESSAGE_WAIT_S
    while not main.last_seen and not main.parent_gone and time.monotonic() < deadline:
        main.poll(50)
    lost = pool.stop(SHARDS_STOP_S)
    lost += publishing.drain(control.DRAIN_S)
    publishing.heartbeat()
    final = control.Snapshot(generation, main.families(), publishing.tap_counters())
    if not say(final, wait_s=LAST_SNAPSHOT_WAIT_S):
        log.warning("shutdown: the last metrics snapshot could not be sent")
    if lost:
        log.warning(
            "shutdown: %d queued record(s) lost after the %.0fs drain", lost, control.DRAIN_S
        )
    publishing.close()
    if link is not None:
        link.close()
    if main.handoff is not None:
        main.handoff.close()
    control_socket.close(linger=1000)
    context.term()
    return 0
