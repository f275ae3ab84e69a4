"""The tap worker's shards, as its main sees them: spawn, route, account, replace.

Runs in the worker's main process (``worker/main/loop.py``). The CPU work (JSON,
templates, tokenizers, response parsing, envelopes) runs in N shard processes
(``worker/shard/loop.py``), so the worker scales with the cores it is given and the
main, which never does that work, keeps its one-second heartbeats whatever one
request costs.

Routing, without decoding (``channel.handoff.peek``, ``Request.routing``): a
request goes to a ready shard chosen by its conversation (``shard_key``: the
session header Dynamo reads, when the client sends one, so a conversation's
turns meet the segments of the turns before in one shard's cache), else by its
key (the serving process's counter: round-robin); its chunks and end follow it
to that shard, forwarded as the serving loop sent them.
The main keeps each open request's shard and the taps still waiting for it
(``OpenRequest.waiting``, replaced by each of the shard's settle messages).

Guarantees (every request handed over yields, per tap, one record or one
counted drop, whatever a shard does):
- a shard's pipe holds at most ``handoff_max_bytes / N`` bytes the shard has
  not read; past it a request is dropped on every tap (``handoff_full``) and a
  request whose chunks were dropped ends as a lost capture (its joined taps drop
  ``handoff_full``), as on the serving side;
- a shard that dies costs its open requests one ``worker_died`` drop on each
  tap still waiting, and is started again;
- a shard over ``worker.max_rss_mb`` is replaced between requests: a new shard
  takes the new requests, the old one finishes its open requests (for up to
  ``RETIRE_DRAIN_S``; what is still open then counts as ``worker_died``) and exits.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import select
import socket
import time

from prometheus_client import CollectorRegistry

from shadow_proxy.channel.families import Totals
from shadow_proxy.channel.handoff import End, Kind, Request, peek
from shadow_proxy.channel.stream import StreamDecoder, split_frames, stream_message
from shadow_proxy.config import Config, Priority
from shadow_proxy.exchange import DropReason
from shadow_proxy.lifeline import reap
from shadow_proxy.worker import messages
from shadow_proxy.worker.lag import LagBound, LateStage
from shadow_proxy.worker.main.publishing import Publishing
from shadow_proxy.worker.main.shards import (
    OpenRequest,
    PoolMetrics,
    RestartReason,
    Shard,
    shard_key,
    spawn_shard,
    write_out,
)

log = logging.getLogger(__name__)

#: How long a retiring shard may take to finish its open requests.
RETIRE_DRAIN_S = 120.0
#: A slot's shard is recycled (over ``worker.max_rss_mb``) at most this often: a
#: bound below what a fresh shard needs costs one restart a minute, not a loop.
RECYCLE_EVERY_S = 60.0
#: Wait before starting again a shard that failed to start.
RESTART_DELAY_S = 1.0
#: Bytes read from one socket per loop turn.
READ_BYTES = 1 << 20


class Pool:
    """The shards of one worker main, and the requests open in them."""

    def __init__(
        self,
        config: Config,
        publishing: Publishing,
        directory: str,
        registry: CollectorRegistry,
        processes: int,
    ):
        self.config = config
        self.publishing = publishing
        self.processes = processes
        self.path = f"{directory}/shards-{os.getpid()}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(processes * 2 + 4)
        self.listener.setblocking(False)
        self.bound = max(1, config.worker.handoff_max_bytes // processes)
        self.lag = LagBound.from_seconds(config.worker.max_lag_s)
        self.slots: list[Shard | None] = [None] * processes
        self.replacing: dict[int, Shard] = {}
        self.shards: dict[int, Shard] = {}
        self.by_fd: dict[int, Shard] = {}
        self.unbound: dict[int, tuple[socket.socket, StreamDecoder]] = {}
        self.open: dict[bytes, OpenRequest] = {}
        self.totals = Totals()
        self._tokens = itertools.count(1)
        self._restart_at: dict[int, float] = {}
        self.failure: str | None = None
        self.stopping = False
        #: Records lost with shards that died or were stopped (one per tap).
        self.lost = 0
        self.metrics = PoolMetrics(registry)

    # -- lifecycle -----------------------------------------------------------------

    def spawn(self, index: int) -> Shard:
        token = next(self._tokens)
        shard = spawn_shard(self.config, self.path, self.processes, index, token)
        self.shards[token] = shard
        return shard

    def start(self) -> None:
        """Spawn every shard (they load their models in parallel)."""
        for index in range(self.processes):
            self.slots[index] = self.spawn(index)

    def all_ready(self) -> bool:
        return all(s is not None and s.ready for s in self.slots)

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            conn.setblocking(False)
            self.unbound[conn.fileno()] = (conn, StreamDecoder())

    def fds(self) -> list[tuple[int, bool]]:
        """Sockets to poll: (fd, wants to write)."""
        fds = [(fd, False) for fd in self.unbound]
        fds += [(fd, bool(shard.out)) for fd, shard in self.by_fd.items()]
        return fds

    # -- the hand-off, routed --------------------------------------------------------

    def route(self, message: bytes) -> None:
        """One request, chunks or end message from the serving loop (a stream
        message, forwarded as it came)."""
        kind, key = peek(message)
        if kind == Kind.REQUEST.value:
            self._route_request(key, message)
            return
        request = self.open.get(key)
        if request is None:
            return  # a request given up (late, lost, its shard died) or never handed over
        shard = request.shard
        if kind == Kind.CHUNKS.value:
            if not request.lost:
                if shard.out_bytes + len(message) > self.bound:
                    request.lost = True
                else:
                    shard.queue(message)
        elif kind == Kind.END.value:
            if request.lost or shard.out_bytes + len(message) > self.bound:
                end = End.decode(split_frames(message))
                message = stream_message(End.lost(key, end.offset_ns).encode())
            shard.queue(message)

    def _route_request(self, key: bytes, message: bytes) -> None:
        arrival_mono_ns, lost_before, headers = Request.routing(message)
        publishing = self.publishing
        publishing.count_lost(lost_before)
        if self.lag.late(arrival_mono_ns, time.monotonic_ns()):
            publishing.late.labels(LateStage.INTAKE).inc()
            publishing.drop_request(DropReason.LATE)
            return
        ready = [s for s in self.slots if s is not None and s.ready]
        if not ready:
            publishing.drop_request(DropReason.WORKER_DIED)
            return
        shard = ready[shard_key(key, headers) % len(ready)]
        if shard.out_bytes + len(message) > self.bound:
            publishing.drop_request(DropReason.HANDOFF_FULL)
            return
        self.open[key] = OpenRequest(shard, dict.fromkeys(range(len(publishing.queues)), 1))
        shard.keys.add(key)
        shard.queue(message)

    def flush(self) -> None:
        for shard in list(self.by_fd.values()):
            if shard.out:
                write_out(shard)

    # -- what shards send ---------------------------------------------------------------

    def readable(self, fd: int) -> None:
        if fd in self.unbound:
            self._read_unbound(fd)
            return
        shard = self.by_fd.get(fd)
        if shard is None or shard.sock is None:
            return
        try:
            data = shard.sock.recv(READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._gone(shard)
            return
        for message in shard.decoder.feed(data):
            self._on_message(shard, messages.decode(split_frames(message)))

    def _read_unbound(self, fd: int) -> None:
        conn, decoder = self.unbound[fd]
        try:
            data = conn.recv(READ_BYTES)
        except BlockingIOError:
            return
        if not data:
            del self.unbound[fd]
            conn.close()
            return
        received = decoder.feed(data)
        if not received:
            return
        del self.unbound[fd]
        hello = messages.decode(split_frames(received[0]))
        shard = self.shards.get(hello.token) if isinstance(hello, messages.Hello) else None
        if shard is None or shard.sock is not None:
            conn.close()
            return
        shard.sock, shard.decoder = conn, decoder
        self.by_fd[fd] = shard
        for message in received[1:]:
            self._on_message(shard, messages.decode(split_frames(message)))

    def _on_message(self, shard: Shard, message: messages.ShardMessage) -> None:
        publishing = self.publishing
        match message:
            case messages.Record(tap=tap, ready_mono_ns=ready, record=record):
                publishing.record(tap, record, ready)
            case messages.Settle(key=key, waiting=waiting, done=done):
                self._settle(shard, key, waiting, done)
            case messages.Drop(tap=tap, reason=reason, count=count):
                publishing.drop(tap, reason, count)
            case messages.Skip(tap=tap, reason=reason):
                publishing.skip(tap, reason)
            case messages.Metrics(families=families):
                self.totals.update(shard.token, families)
            case messages.Ready():
                shard.ready = True
                shard.info = message
                self._on_ready(shard)
            case messages.Failed(message=why):
                self.failure = why
                log.error("shard %d failed to start: %s", shard.index, why)
            case messages.Retire(rss_mb=rss_mb):
                self._retire(shard, rss_mb)
            case messages.Hello():
                pass  # only the first message of a connection names its shard

    def _settle(self, shard: Shard, key: bytes, waiting: tuple[int, ...], done: bool) -> None:
        request = self.open.get(key)
        if request is None or request.shard is not shard:
            return
        now = collections.Counter(waiting)
        decided = 0
        for tap in request.waiting:
            if tap not in now:
                decided |= 1 << tap
        self.publishing.resolve(decided)
        request.waiting = dict(now)
        if done:
            del self.open[key]
            shard.keys.discard(key)
            if shard.retiring and not shard.keys:
                shard.send_exit()

    def _on_ready(self, shard: Shard) -> None:
        replaced = self.replacing.get(shard.index)
        if replaced is shard:
            del self.replacing[shard.index]
            old = self.slots[shard.index]
            self.slots[shard.index] = shard
            if old is not None:
                old.retiring = True
                old.drain_deadline = time.monotonic() + RETIRE_DRAIN_S
                if not old.keys:
                    old.send_exit()
        self._gauges()

    def _retire(self, shard: Shard, rss_mb: int) -> None:
        if shard.retiring or self.slots[shard.index] is not shard:
            return
        if shard.index in self.replacing or self.stopping:
            return
        if time.monotonic() - shard.started < RECYCLE_EVERY_S and shard.replaces:
            log.warning(
                "shard %d at %d MiB soon after it started: worker.max_rss_mb may be below "
                "what a shard needs",
                shard.index,
                rss_mb,
            )
            return
        log.warning(
            "shard %d at %d MiB (over worker.max_rss_mb): replacing it", shard.index, rss_mb
        )
        self.metrics.restarts.labels(RestartReason.RECYCLED).inc()
        replacement = self.spawn(shard.index)
        replacement.replaces = True
        self.replacing[shard.index] = replacement

    def _gone(self, shard: Shard) -> None:
        """The shard's socket closed: it exited or died. Its open requests are lost."""
        if shard.sock is not None:
            self.by_fd.pop(shard.sock.fileno(), None)
            shard.sock.close()
            shard.sock = None
        reap(shard.process, 5)
        self.shards.pop(shard.token, None)
        reason = DropReason.CLOSED if self.stopping else DropReason.WORKER_DIED
        for key in list(shard.keys):
            request = self.open.pop(key, None)
            if request is not None and request.waiting:
                self.lost += self.publishing.drop_waiting(reason, request.waiting)
        shard.keys.clear()
        self.totals.retire(shard.token)
        if self.replacing.get(shard.index) is shard:
            del self.replacing[shard.index]
        if self.slots[shard.index] is shard:
            self.slots[shard.index] = None
            if not self.stopping:
                if shard.ready:
                    pid = shard.process.pid
                    log.error("shard %d (pid %d) died; starting it again", shard.index, pid)
                    self.metrics.restarts.labels(RestartReason.DIED).inc()
                    self._restart_at[shard.index] = time.monotonic()
                else:
                    self._restart_at[shard.index] = time.monotonic() + RESTART_DELAY_S
        self._gauges()

    def tick(self) -> None:
        """Start shards that are due; notice shards that died before connecting;
        end retiring shards past their drain deadline."""
        now = time.monotonic()
        for index, when in list(self._restart_at.items()):
            if now >= when and self.slots[index] is None:
                del self._restart_at[index]
                self.slots[index] = self.spawn(index)
        for shard in list(self.shards.values()):
            if shard.sock is None and shard.process.poll() is not None:
                self._gone(shard)
            elif shard.retiring and now > shard.drain_deadline and shard.process.poll() is None:
                open_requests = len(shard.keys)
                log.warning(
                    "retiring shard %d still had %d request(s) open; stopped",
                    shard.index,
                    open_requests,
                )
                shard.process.kill()

    def _gauges(self) -> None:
        running = [s for s in self.shards.values() if s.ready]
        self.metrics.processes.set(len(running))
        idle = [s for s in running if s.info is not None and s.info.policy == Priority.IDLE]
        self.metrics.idle.set(len(idle))
        by_malloc = collections.Counter(s.info.malloc for s in running if s.info is not None)
        self.metrics.seen_mallocs.update(by_malloc)
        for library in self.metrics.seen_mallocs:
            self.metrics.malloc.labels(library).set(by_malloc[library])

    def stop(self, deadline_s: float) -> int:
        """Tell every shard to finish what it was sent and its open requests (as
        ``shutdown`` records) and exit; wait for them up to ``deadline_s``, then kill
        what is left: its requests are lost as ``closed``. Returns the records lost."""
        self.stopping = True
        self.lost = 0
        for shard in list(self.by_fd.values()):
            shard.send_exit()
        deadline = time.monotonic() + deadline_s
        while self.by_fd and time.monotonic() < deadline:
            self.flush()
            poller = select.poll()
            for fd, wants_write in self.fds():
                poller.register(fd, select.POLLIN | (select.POLLOUT if wants_write else 0))
            for fd, _ in poller.poll(50):
                self.readable(fd)
        for shard in list(self.shards.values()):
            if shard.process.poll() is None:
                shard.process.kill()
            self._gone(shard)
        for conn, _ in self.unbound.values():
            conn.close()
        self.unbound.clear()
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        return self.lost
