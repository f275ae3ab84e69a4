"""A joiner shard: one of the tap worker's processes that do the CPU work.

Spawned by the worker's main (``worker/main/pool.py``) as ``python -m
shadow_proxy.worker.shard.loop``, its arguments pickled on stdin. It connects to the
main's socket, loads the models (each with an exact incremental prompt
encoder and its work budget), says ready, moves every thread to the idle
scheduling class, then reads the hand-off messages the main routes to it and
runs them through a ``Joiner`` whose tap queues (``RemoteQueue``) hand records
and losses to the main instead of queueing them: only the main takes seqs.

Per message, around the joiner (each loss counted, never silent):
- lag: a ``q`` older than ``worker.max_lag_s`` is not preprocessed (every tap
  drops it as ``late``); at an ``e`` older than it, the joined taps' records are
  not built (``late``);
- CPU: each request is charged the thread CPU time of its messages, checked
  between messages and between the decoded pieces of a chunk; past
  ``worker.max_request_cpu_s`` its response is read no further and its record
  carries what was read (``worker/budget.py``, with the other budgets);
- a failure (a bug) costs the request's records that did not exist yet one
  ``worker_error`` drop each; it is counted by exception type and logged
  without its text;
- after each message the main is told which taps still wait for the request
  (``K``), so that a shard's death costs exactly those (``worker_died``).

Every second: a metrics snapshot, and the RSS check: past ``worker.max_rss_mb``
the shard asks to be replaced, and keeps serving until the main says so.
On ``x`` or when the main's socket closes: open requests get their
``shutdown`` records, then the shard exits.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

from prometheus_client import Counter

from shadow_proxy.channel import frames as hf
from shadow_proxy.config import Config, Priority, TapConfig
from shadow_proxy.exchange import EndKind
from shadow_proxy.worker import messages as sw
from shadow_proxy.worker import priority
from shadow_proxy.worker.budget import WorkBudget
from shadow_proxy.worker.lag import LagBound, intake_lag_histogram, late_counter
from shadow_proxy.worker.request.tokenizer import ModelLoadError
from shadow_proxy.worker.shard.joiner import Joiner
from shadow_proxy.worker.shard.models import TokenizerMetrics, handle_safely, load_models

__all__ = ["RemoteQueue", "ShardLoop", "handle_safely", "load_models", "run"]

log = logging.getLogger(__name__)

SNAPSHOT_S = 1.0
#: While over ``worker.max_rss_mb``, how often a shard asks again to be replaced.
RETIRE_ASK_S = 10.0
READ_BYTES = 1 << 20
#: A shard is the process the OOM killer should pick (raising it needs no privilege).
OOM_SCORE_ADJ = 500


class _Reported(dict):
    """``queue.dropped`` of a remote queue: an increment is sent to the main
    (``Joiner.publish`` counts an encode error this way, after taking the seq)."""

    def __init__(self, queue: RemoteQueue):
        super().__init__()
        self._queue = queue

    def __missing__(self, reason: str) -> int:
        return 0

    def __setitem__(self, reason: str, value: int) -> None:
        if value > 0:
            self._queue.drop(reason, value)


class RemoteQueue:
    """A tap queue whose records and losses go to the main (it takes the seqs)."""

    def __init__(self, index: int, config: TapConfig, shard: ShardLoop):
        self.index = index
        self.bit = 1 << index
        self.config = config
        self._shard = shard
        self.dropped = _Reported(self)

    @property
    def name(self) -> str:
        return self.config.name

    def take_seq(self) -> int:
        return sw.SEQ_PLACEHOLDER

    def offer(self, payload: bytes, ready_mono_ns: int = 0) -> bool:
        shard = self._shard
        shard.touched |= self.bit
        shard.emit(sw.record(self.index, shard.ready_ns, sw.seq_offset(payload), payload))
        return True

    def drop(self, reason: str, count: int = 1) -> None:
        self._shard.touched |= self.bit
        self._shard.emit(sw.drop(self.index, reason, count))

    def skip(self, reason: str) -> None:
        self._shard.touched |= self.bit
        self._shard.emit(sw.skip(self.index, reason))


class ShardLoop:
    """The joiner, wrapped: lag, CPU budget, failures, settles, the outgoing buffer."""

    def __init__(self, config: Config, joiner: Joiner, sock: socket.socket, processes: int):
        self.config = config
        self.joiner = joiner
        self.sock = sock
        self.out: list[bytes] = []
        self.touched = 0
        self.ready_ns = 0
        #: Requests the joiner holds, in arrival order, and the CPU each cost.
        self.open: dict[bytes, float] = {}
        self.gave_up: set[bytes] = set()
        worker = config.worker
        self.bound = LagBound.from_seconds(worker.max_lag_s)
        self.max_cpu_s = worker.max_request_cpu_s
        self.cpu_reason = f"work budget: over {self.max_cpu_s:g} s of CPU"
        self.max_rss_mb = worker.max_rss_mb
        #: When the shard last asked to be replaced; requests it has handled.
        self.retire_asked = 0.0
        self.requests = 0
        for index, tap in enumerate(joiner.taps):
            tap.queue = RemoteQueue(index, tap.config, self)
        joiner.metrics.queues = []  # the main counts the taps
        joiner.lost_seen = 1 << 64  # the main counts what the serving loop could not hand over
        joiner.max_in_flight = max(1, worker.max_in_flight // processes)
        registry = joiner.metrics.registry
        self.intake_lag = intake_lag_histogram(registry)
        self.late = late_counter(registry)
        self.budget_exceeded = Counter(
            "shadow_worker_budget_exceeded",
            "Requests whose response was read no further, by work budget "
            "(decoded: worker.max_decoded_bytes; events: more than n x max_tokens "
            "accounts for; cpu: worker.max_request_cpu_s).",
            ["budget"],
            registry=registry,
        )
        for budget in WorkBudget:
            self.budget_exceeded.labels(budget)
        registry.register(TokenizerMetrics(joiner.models))

    def emit(self, frames: list[bytes]) -> None:
        self.out += hf.stream_buffers(frames)[0]

    def flush(self) -> None:
        out, self.out = self.out, []
        while out:
            hf.consume(out, self.sock.sendmsg(out[:512]))

    def waiting(self, key: bytes) -> list[int]:
        """The records the request still owes (joined taps, per prompt of a batch)."""
        pending = self.joiner.pending.get(key)
        if pending is None or pending.recorder is None:
            return []
        return [tap.queue.index for part in pending.parts() for tap in part.joined]

    def mask(self, key: bytes) -> int:
        return sum({1 << tap for tap in self.waiting(key)})

    # -- one message ------------------------------------------------------------------

    def on_message(self, message: bytes) -> bool:
        """Handle one message from the main; False when told to exit."""
        kind, key = hf.peek(message)
        if kind == sw.EXIT:
            return False
        frames = hf.split_frames(message)
        if kind == hf.KIND_REQUEST:
            self.on_request(key, frames)
        elif kind == hf.KIND_CHUNK and key in self.open:
            self.on_chunk(key, frames)
        elif kind == hf.KIND_END and key in self.open:
            self.on_end(key, frames)
        return True

    def on_request(self, key: bytes, frames: list[bytes]) -> None:
        try:
            _, _, arrival_mono_ns, _ = hf.REQUEST_META.unpack(frames[0][hf.HEADER :])
        except struct.error:  # a bug of the sender: the request is lost on every tap
            self.joiner.metrics.failures.labels("struct.error").inc()
            log.error("hand-off message dropped: a request with a malformed header")
            for tap in self.joiner.taps:
                tap.queue.drop("worker_error")
            self.emit(sw.settle(key, [], True))
            return
        now = time.monotonic_ns()
        if self.bound.late(arrival_mono_ns, now):
            self.late.labels("intake").inc()
            for tap in self.joiner.taps:
                tap.queue.drop("late")
            self.emit(sw.settle(key, [], True))
            return
        self.intake_lag.observe((now - arrival_mono_ns) / 1e9)
        self.requests += 1
        self.ready_ns = arrival_mono_ns
        self.touched = 0
        started = time.thread_time()
        ok = handle_safely(self.joiner, frames)
        cost = time.thread_time() - started
        pending = self.joiner.pending
        if not ok:
            untouched = self.all_taps & ~self.touched & ~self.mask(key)
            for tap in self.joiner.taps:
                if untouched & tap.queue.bit:
                    tap.queue.drop("worker_error")
        if key in pending:
            self.open[key] = cost
            self.emit(sw.settle(key, self.waiting(key), False))
        else:
            self.emit(sw.settle(key, [], True))
        if len(self.open) > len(pending):  # the joiner gave up its oldest (max_in_flight)
            for old in [k for k in self.open if k not in pending]:
                self.forget(old)

    def on_chunk(self, key: bytes, frames: list[bytes]) -> None:
        pending = self.joiner.pending.get(key)
        recorder = pending.recorder if pending is not None else None
        if recorder is None:
            return  # only the end matters (prompt-token check)
        if self.open[key] > self.max_cpu_s:
            recorder.give_up(self.cpu_reason, WorkBudget.CPU)
            self._count_budget(key, recorder)
            return
        started = self.set_deadline(key, recorder)
        handle_safely(self.joiner, frames)
        self.open[key] += time.thread_time() - started
        self._count_budget(key, recorder)

    def on_end(self, key: bytes, frames: list[bytes]) -> None:
        joiner = self.joiner
        pending = joiner.pending.get(key)
        if pending is None:
            self.forget(key)
            return
        end, offset = hf.END_META.unpack(frames[0][hf.HEADER :])
        self.ready_ns = pending.arrival_mono_ns + offset
        mask = self.mask(key)
        if mask and self.bound.late(self.ready_ns, time.monotonic_ns()):
            self.late.labels("end").inc()
            for part in pending.parts():
                for tap in part.joined:
                    tap.queue.drop("late")
            joiner.pending.pop(key, None)
        else:
            recorder = pending.recorder
            if recorder is not None:  # the end may carry the body's last bytes
                self.set_deadline(key, recorder)
            self.touched = 0
            if not handle_safely(joiner, frames):
                for part in pending.parts():
                    for tap in part.joined:
                        if mask & ~self.touched & tap.queue.bit:
                            tap.queue.drop("worker_error")
            if recorder is not None and end != EndKind.CAPTURE_LOST:
                self._count_budget(key, recorder)
        self.forget(key)

    def set_deadline(self, key: bytes, recorder: Any) -> float:
        """The request's CPU budget also holds between the decoded pieces of one
        message: a small chunk of a compressed body can take seconds to parse.
        Returns the thread CPU time now."""
        now = time.thread_time()
        recorder.cpu_deadline = now + self.max_cpu_s - self.open.get(key, 0.0)
        recorder.cpu_reason = self.cpu_reason
        return now

    def _count_budget(self, key: bytes, recorder: Any) -> None:
        if recorder.gave_up_on is not None and key not in self.gave_up:
            self.gave_up.add(key)
            self.budget_exceeded.labels(recorder.gave_up_on).inc()

    def forget(self, key: bytes) -> None:
        self.open.pop(key, None)
        self.gave_up.discard(key)
        self.joiner.pending.pop(key, None)
        self.emit(sw.settle(key, [], True))

    @property
    def all_taps(self) -> int:
        return (1 << len(self.joiner.taps)) - 1

    def finish(self) -> None:
        """Open requests get their ``shutdown`` records; all are settled."""
        self.ready_ns = time.monotonic_ns()
        self.joiner.finish_pending()
        for key in list(self.open):
            self.forget(key)

    # -- the loop -------------------------------------------------------------------

    def rss_mb(self) -> int:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)

    def periodic(self) -> None:
        self.emit(sw.metrics(self.joiner.metrics.snapshot()))
        # Between requests (this runs between messages): over the bound after it
        # has served, the shard asks to be replaced, again every RETIRE_ASK_S.
        now = time.monotonic()
        if self.max_rss_mb is not None and self.requests and now >= self.retire_asked:
            rss = self.rss_mb()
            if rss > self.max_rss_mb:
                self.retire_asked = now + RETIRE_ASK_S
                self.emit(sw.retire(rss))

    def run(self) -> None:
        decoder = hf.StreamDecoder()
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        next_snapshot = time.monotonic()
        running = True
        while running:
            now = time.monotonic()
            if now >= next_snapshot:
                next_snapshot = now + SNAPSHOT_S
                self.periodic()
                self.flush()
            if not poller.poll(max(0, (next_snapshot - now) * 1000)):
                continue
            data = self.sock.recv(READ_BYTES)
            if not data:
                break
            for message in decoder.feed(data):
                if not self.on_message(message):
                    running = False
                    break
            if running and not poller.poll(0):
                # Idle: the metrics now, right after the records they count (the
                # main relays both in one snapshot). Busy: once a second.
                self.emit(sw.metrics(self.joiner.metrics.snapshot()))
            self.flush()
        self.finish()
        self.periodic()
        self.flush()


def run(config: Config, token: int, path: str, processes: int) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s shard: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's main decides when to stop
    try:  # under memory pressure the kernel kills a shard (counted, restarted) first
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE_ADJ))
    except OSError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(b"".join(hf.stream_buffers(sw.hello(token, os.getpid()))[0]))
    try:
        models = load_models(config)
        joiner = Joiner(config, models)
    except ModelLoadError as e:
        sock.sendall(b"".join(hf.stream_buffers(sw.failed(str(e)))[0]))
        return 1
    loop = ShardLoop(config, joiner, sock, processes)
    worker = config.worker
    achieved = priority.lower_priority(
        fallback_nice=worker.nice, idle=worker.priority is Priority.IDLE
    )
    info = {"pid": os.getpid(), "policy": achieved.policy, "fallback": achieved.fallback_reason}
    loop.emit(sw.ready(info))
    loop.flush()
    try:
        loop.run()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the main is gone
    return 0


def main() -> None:
    args = pickle.load(sys.stdin.buffer)
    raise SystemExit(run(*args))


if __name__ == "__main__":
    main()
