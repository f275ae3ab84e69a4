"""The JetStream publisher: each ``nats`` tap's records to one replicated stream (SPEC 9).

Threading model. The tap worker is one synchronous loop around a ZeroMQ poller;
nats-py is asyncio only. So the worker process has one ``JetStreamLink``: a
daemon thread that runs its own asyncio loop, and on it the one NATS
connection, the stream check and the publishing of every ``nats`` tap. The
worker thread and the link thread share, per tap, only a hand-over deque
(the worker appends, the link pops) and counters that each have one writer:

- ``JetStreamPublisher.pump`` (worker thread) moves records from the tap's
  queue to the hand-over while fewer than ``capacity`` are in flight (handed
  over and not yet settled), wakes the link at most once per turn and
  returns. It never waits: when the window is full, records stay in the tap's
  queue, the queue fills and new records are dropped and counted ``full``.
- The link thread publishes each record with a reply inbox and these headers:
  ``Nats-Msg-Id: {publisher_id}.{tap}.{seq}``, ``Shadow-Tap``, ``Shadow-Seq``,
  ``Shadow-Publisher-Id``, ``Shadow-Transport-Seq`` (dense per publisher, taken
  when the link takes the record over: a gap in it is a record lost after the
  hand-over) and ``Nats-Expected-Stream`` (so a record is stored
  in the configured stream or refused, never in another stream that happens
  to match). The data is the envelope's MessagePack, the ZeroMQ payload.
- A record is settled by its acknowledgement (``published``, the ack latency
  observed from its first send). Without one within ``ack_timeout(attempt)``
  (2 s, doubling up to 10 s), after an error, or on a new connection, it is
  sent again with the same ``Nats-Msg-Id``: JetStream stores it once within
  the stream's duplicate window. A record is never given up while the link
  runs; at close, what is left is counted as dropped: ``closed`` (never sent)
  or ``unacked`` (sent, never acknowledged: it may be in the stream).

The connection reconnects in the background for ever (nats-py's reconnect
loop; pings every 2 s notice a server that stopped answering). Nothing is
sent while disconnected, or before the stream was found (or created) and
covers the taps' subjects. At start-up the worker waits a bounded time for
that first check: a stream that does not cover the subjects stops start-up;
no answer lets the proxy start, and the check runs when a server answers.

Memory, per tap: the queue (``capacity`` records) plus the window
(``capacity`` records), plus nats-py's outgoing buffer (``PENDING_BYTES`` while
disconnected; while connected, at most the window's records times the few
resends a stalled connection takes before the pings drop it).

Heartbeats (tail-loss visibility): the records carry ``Shadow-Seq`` and the
per-tap counters are in ``/metrics``; in the stream, every
``HEARTBEAT_S`` and only when the tap's numbers changed, a heartbeat (the
SPEC 4 heartbeat map) goes to
``{subject}.heartbeat``, and one more at close. It is sent once, never
retried, and takes no room in the window. A reader that sees ``next_seq = N``
knows every ``seq`` below N was assigned, so a record missing at the end of
its range is counted as tail loss. Idle taps add nothing to the stream.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from shadow_proxy.config import Config, NatsConfig, Transport
from shadow_proxy.records.errors import SourceError
from shadow_proxy.records.nats_access import redact, redact_all
from shadow_proxy.records.nats_connect import cause, quiet_asyncio
from shadow_proxy.worker.main.publishers.jetstream_metrics import JetStreamMetrics, LinkStats
from shadow_proxy.worker.main.publishers.jetstream_stream import ensure_stream
from shadow_proxy.worker.main.publishers.jetstream_tap import JetStreamPublisher
from shadow_proxy.worker.main.tap_queue import TapQueue

log = logging.getLogger(__name__)

#: How long the worker waits at start-up for the first stream check.
STARTUP_CHECK_S = 3.0
#: After a failed stream check (no answer, or subjects not covered).
RECHECK_S = 2.0
CONNECT_TIMEOUT_S = 2.0
RECONNECT_WAIT_S = 0.5
PING_INTERVAL_S = 2.0
PENDING_BYTES = 8 * 1024 * 1024
FLUSH_TIMEOUT_S = 2.0
API_TIMEOUT_S = 5.0
#: The link's loop wakes at least this often while records are in flight.
TICK_S = 0.05
IDLE_TICK_S = 1.0
CLOSE_S = 2.0
LOG_EVERY_S = 10.0
#: What a connection error that is not a refusal says (the client names only its
#: class): the server went away (a node killed or restarted), or none answers.
LOST = {
    "UnexpectedEOF": "the server closed the connection",
    "ConnectionResetError": "the server reset the connection",
    "ConnectionRefusedError": "no server listening at the address",
    "TimeoutError": "no answer in time",
    "StaleConnectionError": "the server stopped answering pings",
}


class JetStreamLink:
    """The worker's one NATS connection, on its own thread and asyncio loop."""

    def __init__(self, config: NatsConfig):
        self.config = config
        self.publishers: list[JetStreamPublisher] = []
        self.stats = LinkStats()
        self.metrics = JetStreamMetrics(self.stats, self.publishers)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="jetstream", daemon=True)
        #: Set by the worker once every tap has its publisher (the check needs them all).
        self.registered = threading.Event()
        self.checked = threading.Event()
        self.problem: str | None = None
        self.stream_ok = False
        #: A check found (or made) the stream once: a later creation means it vanished.
        self.stream_seen = False
        self.closing = False
        self.open_publishers = 0
        self.started_at = 0.0
        self._wake_requested = False
        self._wake_event: asyncio.Event | None = None
        self._check_task: asyncio.Task | None = None
        self._last_log: dict[str, float] = {}
        self.nc = NATS()
        self.reply_prefix = ""

    @classmethod
    def for_config(cls, config: Config) -> JetStreamLink | None:
        """A started link when a tap uses NATS, else None."""
        if config.nats is None or not any(t.transport is Transport.NATS for t in config.taps):
            return None
        link = cls(config.nats)
        link.start()
        return link

    @property
    def subjects(self) -> list[str]:
        return [s for p in self.publishers for s in (p.subject, p.heartbeat_subject)]

    def publisher(self, queue: TapQueue) -> JetStreamPublisher:
        publisher = JetStreamPublisher(self, queue, len(self.publishers))
        self.publishers.append(publisher)
        self.open_publishers += 1
        return publisher

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.thread.start()

    def startup_problem(self, budget_s: float = STARTUP_CHECK_S) -> str | None:
        """Every tap has its publisher: check the stream, waiting at most ``budget_s``
        since ``start`` (at least 1 s) for the first answer. Returns why start-up
        must stop (the stream does not cover the subjects), else None."""
        self.registered.set()
        self.wake_now()
        remaining = self.started_at + budget_s - time.monotonic()
        if not self.checked.wait(max(1.0, remaining)):
            log.warning(
                "no NATS server answered within %.0fs (%s); the JetStream taps queue records "
                "and publish once one does",
                budget_s,
                redact_all(list(self.config.servers)),
            )
            return None
        return self.problem

    def wake(self) -> None:
        """Called from the worker thread; at most one wake-up is pending at a time."""
        if not self._wake_requested:
            self._wake_requested = True
            try:
                self.loop.call_soon_threadsafe(self._on_wake)
            except RuntimeError:  # the loop is closed: the link has stopped
                pass

    def note(self, message: str, *args: object) -> None:
        """Log a problem at most once every ``LOG_EVERY_S`` per message."""
        now = time.monotonic()
        if now - self._last_log.get(message, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._last_log[message] = now
            log.warning("JetStream: " + message, *args)

    def release(self, publisher: JetStreamPublisher) -> None:
        self.open_publishers -= 1
        if self.open_publishers <= 0:
            self.close()

    def close(self, timeout: float = CLOSE_S) -> None:
        """Stop the thread (bounded); what is still held is counted as dropped."""
        if self.thread.is_alive():
            self.closing = True
            self.wake_now()
            self.thread.join(timeout + 1.0)
        lost = 0
        for publisher in self.publishers:
            never, unacked = publisher.leftovers()
            dropped = publisher.queue.dropped
            dropped["closed"] += never
            dropped["unacked"] = dropped.get("unacked", 0) + unacked
            publisher.handover.clear()
            publisher.window.clear()
            publisher.settled += never + unacked
            lost += never + unacked
        if lost:
            log.warning("JetStream: %d record(s) not acknowledged at close", lost)

    def wake_now(self) -> None:
        self._wake_requested = False
        self.wake()

    # -- the link's thread -------------------------------------------------------

    def _on_wake(self) -> None:
        if self._wake_event is not None:
            self._wake_event.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._wake_event = asyncio.Event()
        connector = asyncio.create_task(self._connect())
        while not self.closing:
            busy = any(p.window or p.handover for p in self.publishers)
            try:
                await asyncio.wait_for(self._wake_event.wait(), TICK_S if busy else IDLE_TICK_S)
            except TimeoutError:
                pass
            self._wake_event.clear()
            self._wake_requested = False
            await self._turn()
        await self._finish(connector)

    async def _turn(self) -> None:
        now = time.monotonic()
        for publisher in self.publishers:
            publisher.take_handover(now)
        if not self.nc.is_connected:
            return
        if not self.stream_ok:
            if not self.registered.is_set():
                return
            if self._check_task is None or self._check_task.done():
                self._check_task = asyncio.create_task(self._check_stream())
            return
        for publisher in self.publishers:
            publisher.expire(now)
            await publisher.send(self.nc, f"{self.reply_prefix}{publisher.index}.", now)
            await self._send_heartbeat(publisher)

    async def _send_heartbeat(self, publisher: JetStreamPublisher) -> None:
        payload = publisher.take_heartbeat()
        if payload is None or not self.nc.is_connected:
            return
        try:
            await self.nc.publish(publisher.heartbeat_subject, payload, headers=publisher.headers)
        except NatsError:
            pass  # a heartbeat is never retried: the next one says more

    async def _connect(self) -> None:
        """Connect (for ever, in the background). Credentials and TLS come from
        ``nats.auth``/``nats.tls``, their secrets read now from their files or
        variables; a file that cannot be read is logged (by name) and the worker
        goes on without the JetStream taps."""
        nc = self.nc
        quiet_asyncio()
        try:
            access = self.config.access().connect_options()
        except SourceError as e:
            self.note("%s", str(e))
            return
        try:
            await nc.connect(
                servers=list(self.config.servers),
                name="shadow-proxy tap worker",
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                # nats-py annotates these as int; it takes seconds as numbers.
                reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]
                connect_timeout=CONNECT_TIMEOUT_S,  # type: ignore[arg-type]
                ping_interval=PING_INTERVAL_S,  # type: ignore[arg-type]
                max_outstanding_pings=2,
                pending_size=PENDING_BYTES,
                flush_timeout=FLUSH_TIMEOUT_S,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
                **access,
            )
            inbox = nc.new_inbox()
            self.reply_prefix = inbox + "."
            await nc.subscribe(inbox + ".>", cb=self._on_reply)
        except asyncio.CancelledError:
            raise
        except (NatsError, OSError, TimeoutError) as e:
            self.note("cannot connect: %s", cause(e) or type(e).__name__)
            return
        self.stats.connected = True
        where = redact(nc.connected_url.geturl()) if nc.connected_url else "?"
        log.info("JetStream: connected to %s (%s)", where, self.config.access().describe())
        self.wake_now()

    async def _check_stream(self) -> None:
        js = self.nc.jetstream(timeout=API_TIMEOUT_S)
        check = await ensure_stream(js, self.config, self.subjects)
        if check.ok:
            if check.created and self.stream_seen:  # it was there, it vanished
                self.stats.stream_problems["missing"] += 1
                self.note("stream %s vanished and was created again", self.config.stream)
            self.stream_seen = True
            self.stream_ok = True
            self.problem = None
        else:
            self.stats.stream_problems[check.reason or "unavailable"] += 1
            self.problem = check.problem if check.fatal else None
            self.note("%s", check.problem)
        if check.ok or check.fatal:
            self.checked.set()
        if not check.ok:
            await asyncio.sleep(RECHECK_S)
        self.wake_now()

    async def _on_reply(self, msg: Msg) -> None:
        rest = msg.subject[len(self.reply_prefix) :]
        index, _, seq = rest.partition(".")
        try:
            publisher = self.publishers[int(index)]
            found = publisher.on_reply(int(seq), msg, time.monotonic())
        except (ValueError, IndexError):
            return
        if not found and self.stream_ok:
            self.stream_ok = False
            # Most often a stream leader election: transient. The check that follows
            # tells a stream that vanished (``missing``) or changed (``subjects``).
            self.stats.stream_problems["no_answer"] += 1
            self.note("no stream answered on %s: checking the stream again", publisher.subject)

    async def _on_error(self, error: Exception) -> None:
        """One line per cause (every ``LOG_EVERY_S``): a refusal says which
        (authorization violation, TLS verification failed, permissions violation
        on a subject) and is counted; never a traceback, never a secret."""
        refusal = cause(error)
        if refusal is not None:
            self.stats.refusals += 1
            self.note("refused: %s", refusal)
        else:
            name = type(error).__name__
            self.note(
                "connection lost, reconnecting: %s (%s)", LOST.get(name, "no cause given"), name
            )

    async def _on_disconnected(self) -> None:
        self.stats.connected = False

    async def _on_reconnected(self) -> None:
        self.stats.connected = True
        self.stats.reconnects += 1
        for publisher in self.publishers:
            publisher.resend_all()
        self.wake_now()

    async def _finish(self, connector: asyncio.Task) -> None:
        """Last heartbeats and a bounded flush, then the connection closes."""
        for publisher in self.publishers:
            if self.stream_ok:
                await self._send_heartbeat(publisher)
        tasks = [t for t in (connector, self._check_task) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        if self.nc.is_connected:
            try:
                await asyncio.wait_for(self.nc.flush(), CLOSE_S / 2)
            except (NatsError, TimeoutError):
                pass
        try:
            await asyncio.wait_for(self.nc.close(), CLOSE_S / 2)
        except (NatsError, TimeoutError):
            pass
