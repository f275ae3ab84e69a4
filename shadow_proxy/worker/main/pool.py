"""The tap worker's shards, as its main sees them: spawn, route, account, replace.

Runs in the worker's main process (``worker/main/loop.py``). The CPU work (JSON,
templates, tokenizers, response parsing, envelopes) runs in N shard processes
(``worker/shard/loop.py``), so the worker scales with the cores it is given and the
main, which never does that work, keeps its one-second heartbeats whatever one
request costs.

Routing: a request's ``q`` goes to a ready shard chosen by its conversation
(``shard_key``: the session header Dynamo reads, when the client sends one, so
a conversation's turns meet the segments of the turns before in one shard's
cache), else by its key (the serving process's counter: round-robin); its
``c`` and ``e`` follow it to that shard.
The main keeps each open request's shard and the taps still waiting for it
(``OpenRequest.waiting``, replaced by each of the shard's settle messages).

Guarantees (every request handed over yields, per tap, one record or one
counted drop, whatever a shard does):
- a shard's pipe holds at most ``handoff_max_bytes / N`` bytes the shard has
  not read; past it a ``q`` is dropped on every tap (``handoff_full``) and a
  request whose ``c`` was dropped ends as a lost capture (its joined taps drop
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
import subprocess
import time
import zlib

from prometheus_client import CollectorRegistry

from shadow_proxy.channel import frames as hf
from shadow_proxy.channel import headers as engine_headers
from shadow_proxy.channel.families import Totals
from shadow_proxy.config import Config
from shadow_proxy.exchange import EndKind
from shadow_proxy.worker import messages as sw
from shadow_proxy.worker.lag import LagBound
from shadow_proxy.worker.main.publishing import Publishing
from shadow_proxy.worker.main.shards import (
    OpenRequest,
    PoolMetrics,
    RestartReason,
    Shard,
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
#: A request message's frames: meta, request id, body, engine headers, content-encoding.
REQUEST_HEADERS_FRAME = 3


def shard_key(key: bytes, message: bytes) -> int:
    """What picks a request's shard: a hash of its conversation id
    (``channel.headers.conversation``, read from the headers frame without
    copying the body), else its key."""
    frame = hf.frame_at(message, REQUEST_HEADERS_FRAME)
    session = engine_headers.conversation(frame) if frame else None
    if session is None:
        return int.from_bytes(key, "big")
    return zlib.crc32(session)


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
        self.unbound: dict[int, tuple[socket.socket, hf.StreamDecoder]] = {}
        self.open: dict[bytes, OpenRequest] = {}
        self.totals = Totals()
        self._tokens = itertools.count(1)
        self._restart_at: dict[int, float] = {}
        self.failure: str | None = None
        self.stopping = False
        #: Records lost with shards that died or were stopped (one per tap).
        self.lost = 0
        metrics = PoolMetrics(registry)
        self.restarts = metrics.restarts
        self.processes_gauge = metrics.processes
        self.idle_gauge = metrics.idle

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
            self.unbound[conn.fileno()] = (conn, hf.StreamDecoder())

    def fds(self) -> list[tuple[int, bool]]:
        """Sockets to poll: (fd, wants to write)."""
        fds = [(fd, False) for fd in self.unbound]
        fds += [(fd, bool(shard.out)) for fd, shard in self.by_fd.items()]
        return fds

    # -- the hand-off, routed --------------------------------------------------------

    def route(self, message: bytes) -> None:
        """One hand-off message from the serving loop."""
        kind, key = hf.peek(message)
        if kind == hf.KIND_REQUEST:
            self._route_request(key, message)
            return
        request = self.open.get(key)
        if request is None:
            return  # a request given up (late, lost, its shard died) or never handed over
        shard = request.shard
        if kind == hf.KIND_CHUNK:
            if not request.lost:
                if shard.out_bytes + len(message) > self.bound:
                    request.lost = True
                else:
                    self._queue(shard, message)
        elif kind == hf.KIND_END:
            if request.lost or shard.out_bytes + len(message) > self.bound:
                frames = hf.split_frames(message)
                _, offset = hf.END_META.unpack(frames[0][hf.HEADER :])
                end = hf.END_META.pack(EndKind.CAPTURE_LOST, offset)
                message = b"".join(
                    hf.stream_buffers([hf.KIND_END + key + end, b"", b"", b"", b""])[0]
                )
            self._queue(shard, message)

    def _route_request(self, key: bytes, message: bytes) -> None:
        start = hf.KIND_OFFSET + hf.HEADER
        _, _, arrival_mono_ns, lost_before = hf.REQUEST_META.unpack_from(message, start)
        publishing = self.publishing
        publishing.count_lost(lost_before)
        if self.lag.late(arrival_mono_ns, time.monotonic_ns()):
            publishing.late.labels("intake").inc()
            publishing.drop_request("late")
            return
        ready = [s for s in self.slots if s is not None and s.ready]
        if not ready:
            publishing.drop_request("worker_died")
            return
        shard = ready[shard_key(key, message) % len(ready)]
        if shard.out_bytes + len(message) > self.bound:
            publishing.drop_request("handoff_full")
            return
        self.open[key] = OpenRequest(shard, dict.fromkeys(range(len(publishing.queues)), 1))
        shard.keys.add(key)
        self._queue(shard, message)

    def _queue(self, shard: Shard, message: bytes) -> None:
        shard.out.append(message)
        shard.out_bytes += len(message)

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
        if shard is None:
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
            self._on_message(shard, hf.split_frames(message))

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
        messages = decoder.feed(data)
        if not messages:
            return
        del self.unbound[fd]
        frames = hf.split_frames(messages[0])
        token, _ = sw.parse_hello(frames) if frames[0][:1] == sw.HELLO else (0, 0)
        shard = self.shards.get(token)
        if shard is None or shard.sock is not None:
            conn.close()
            return
        shard.sock, shard.decoder = conn, decoder
        self.by_fd[fd] = shard
        for message in messages[1:]:
            self._on_message(shard, hf.split_frames(message))

    def _on_message(self, shard: Shard, frames: list[bytes]) -> None:
        kind = frames[0][:1]
        publishing = self.publishing
        if kind == sw.RECORD:
            tap, ready_ns, offset, payload = sw.parse_record(frames)
            publishing.take(tap, payload, offset, ready_ns)
        elif kind == sw.SETTLE:
            key, waiting, done = sw.parse_settle(frames)
            request = self.open.get(key)
            if request is not None and request.shard is shard:
                now = collections.Counter(waiting)
                decided = 0
                for tap in request.waiting:
                    if tap not in now:
                        decided |= 1 << tap
                publishing.resolve(decided)
                request.waiting = dict(now)
                if done:
                    del self.open[key]
                    shard.keys.discard(key)
                    if shard.retiring and not shard.keys:
                        self._send_exit(shard)
        elif kind == sw.DROP:
            tap, count, reason = sw.parse_drop(frames)
            publishing.drop(tap, reason, count)
        elif kind == sw.SKIP:
            tap, reason = sw.parse_skip(frames)
            publishing.skip(tap, reason)
        elif kind == sw.METRICS:
            self.totals.update(shard.token, sw.parse_metrics(frames))
        elif kind == sw.READY:
            shard.ready = True
            shard.info = sw.parse_info(frames)
            self._on_ready(shard)
        elif kind == sw.FAILED:
            self.failure = frames[1].decode("utf-8", "replace")
            log.error("shard %d failed to start: %s", shard.index, self.failure)
        elif kind == sw.RETIRE:
            self._retire(shard, sw.parse_retire(frames))

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
                    self._send_exit(old)
        self._gauges()

    def _retire(self, shard: Shard, rss_mb: int) -> None:
        if shard.retiring or self.slots[shard.index] is not shard:
            return
        if shard.index in self.replacing or self.stopping:
            return
        if time.monotonic() - shard.started < RECYCLE_EVERY_S and shard.replaces:
            log.warning("shard %d at %d MiB soon after it started: worker.max_rss_mb may be "
                        "below what a shard needs", shard.index, rss_mb)  # fmt: skip
            return
        log.warning(
            "shard %d at %d MiB (over worker.max_rss_mb): replacing it", shard.index, rss_mb
        )
        self.restarts.labels(RestartReason.RECYCLED).inc()
        replacement = self.spawn(shard.index)
        replacement.replaces = True
        self.replacing[shard.index] = replacement

    def _send_exit(self, shard: Shard) -> None:
        if not shard.exit_sent:
            shard.exit_sent = True
            self._queue(shard, b"".join(hf.stream_buffers(sw.exit_message())[0]))

    def _gone(self, shard: Shard) -> None:
        """The shard's socket closed: it exited or died. Its open requests are lost."""
        if shard.sock is not None:
            self.by_fd.pop(shard.sock.fileno(), None)
            shard.sock.close()
            shard.sock = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            shard.process.wait(5)
        self.shards.pop(shard.token, None)
        reason = "closed" if self.stopping else "worker_died"
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
                    log.error("shard %d (pid %d) died; starting it again", shard.index,
                              shard.process.pid)  # fmt: skip
                    self.restarts.labels(RestartReason.DIED).inc()
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
                log.warning("retiring shard %d still had %d request(s) open; stopped",
                            shard.index, len(shard.keys))  # fmt: skip
                shard.process.kill()

    def _gauges(self) -> None:
        running = [s for s in self.shards.values() if s.ready]
        self.processes_gauge.set(len(running))
        self.idle_gauge.set(sum(1 for s in running if s.info.get("policy") == "idle"))

    def stop(self, deadline_s: float) -> int:
        """Tell every shard to finish what it was sent and its open requests (as
        ``shutdown`` records) and exit; wait for them up to ``deadline_s``, then kill
        what is left: its requests are lost as ``closed``. Returns the records lost."""
        self.stopping = True
        self.lost = 0
        for shard in list(self.by_fd.values()):
            self._send_exit(shard)
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
            if shard.sock is not None:
                self._gone(shard)
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        return self.lost
