"""A joiner shard: one of the tap worker's processes that do the CPU work.

Spawned by the worker's main (``worker/main/pool.py``, through ``lifeline.spawn``:
it dies with the main). It connects to the main's socket, loads the models (each
with an exact incremental prompt encoder and its work budget), says ready, moves
every thread to the idle scheduling class, then reads the hand-off messages the
main routes to it, decodes each (``channel/handoff.py``) and runs it through its
``Joiner``, which publishes into the shard's ``Outbox``: records and losses go to
the main, which takes the seqs.

Per message, around the joiner (each loss counted, never silent):
- lag: a request older than ``worker.max_lag_s`` is not preprocessed (every tap
  drops it as ``late``); at an end older than it, the joined taps' records are
  not built (``late``);
- CPU: each request is charged the thread CPU time of its messages, checked
  between messages and between the decoded pieces of a chunk; past
  ``worker.max_request_cpu_s`` its response is read no further and its record
  carries what was read (``worker/budget.py``, with the other budgets);
- a failure (a bug, or a message that does not decode) costs the request's
  records that did not exist yet one ``worker_error`` drop each; it is counted by
  exception type and logged without its text;
- after each message the main is told which taps still wait for the request
  (``Settle``), so that a shard's death costs exactly those (``worker_died``).

Every second: a metrics report, and the RSS check: past ``worker.max_rss_mb``
the shard asks to be replaced, and keeps serving until the main says so.
On ``Exit`` or when the main's socket closes: open requests get their
``shutdown`` records, then the shard exits.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from shadow_proxy import allocator
from shadow_proxy.channel.handoff import Chunks, End, HandoffError, Kind, Request, peek
from shadow_proxy.channel.stream import StreamDecoder, split_frames
from shadow_proxy.config import Config, Priority
from shadow_proxy.exchange import DropReason, EndKind
from shadow_proxy.worker import messages, priority
from shadow_proxy.worker.budget import WorkBudget
from shadow_proxy.worker.lag import LagBound, LateStage, intake_lag_histogram, shard_late_counter
from shadow_proxy.worker.request.tokenizer import ModelLoadError
from shadow_proxy.worker.response.recorder import ResponseRecorder
from shadow_proxy.worker.shard.joiner import Joiner
from shadow_proxy.worker.shard.metrics import JoinerMetrics
from shadow_proxy.worker.shard.models import load_models, tokenizer_families
from shadow_proxy.worker.shard.outbox import Outbox

log = logging.getLogger(__name__)

SNAPSHOT_S = 1.0
#: While over ``worker.max_rss_mb``, how often a shard asks again to be replaced.
RETIRE_ASK_S = 10.0
READ_BYTES = 1 << 20
#: A shard is the process the OOM killer should pick (raising it needs no privilege).
OOM_SCORE_ADJ = 500


def guarded(metrics: JoinerMetrics, call: Callable[[], object]) -> bool:
    """Run ``call``; a malformed message or a bug in one record costs that record
    only. The log line names the exception type and where it was raised, never
    its message (which could quote client text). False when it failed."""
    try:
        call()
    except Exception as e:  # a bug in a record's building must not stop the worker
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        kind = type(e)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        metrics.failures.labels(name).inc()
        log.error("hand-off message dropped: %s at %s", name, where)
        return False
    return True


class ShardLoop:
    """The joiner, wrapped: lag, CPU budget, failures, settles."""

    def __init__(self, config: Config, joiner: Joiner, outbox: Outbox):
        self.config = config
        self.joiner = joiner
        self.outbox = outbox
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
        tally = joiner.metrics.tally
        self.intake_lag = intake_lag_histogram(tally)
        self.late = shard_late_counter(tally)
        self.budget_exceeded = tally.counter(
            "shadow_worker_budget_exceeded",
            "Requests whose response was read no further, by work budget "
            "(decoded: worker.max_decoded_bytes; events: more than n x max_tokens "
            "accounts for; cpu: worker.max_request_cpu_s).",
            ["budget"],
        )
        for budget in WorkBudget:
            self.budget_exceeded.labels(budget)
        models = joiner.models
        tally.register(lambda: tokenizer_families(models))

    def waiting(self, key: bytes) -> list[int]:
        """The records the request still owes (joined taps, per prompt of a batch)."""
        pending = self.joiner.pending.get(key)
        if pending is None or pending.recorder is None:
            return []
        return [tap.index for part in pending.parts() for tap in part.joined]

    def mask(self, key: bytes) -> int:
        return sum({1 << tap for tap in self.waiting(key)})

    def settle(self, key: bytes, done: bool) -> None:
        waiting = () if done else tuple(self.waiting(key))
        self.outbox.send(messages.Settle(key, waiting, done))

    def drop_all(self, reason: DropReason, mask: int | None = None) -> None:
        """One record of each tap (in ``mask``; all by default) is lost."""
        for tap in self.joiner.taps:
            if mask is None or mask >> tap.index & 1:
                self.outbox.drop(tap.index, reason)

    # -- one message ------------------------------------------------------------------

    def on_message(self, message: bytes) -> bool:
        """Handle one message from the main; False when told to exit."""
        kind, key = peek(message)
        if kind == messages.Kind.EXIT.value:
            return False
        if kind != Kind.REQUEST.value and key not in self.open:
            return True  # a request given up here (late, evicted, failed)
        decoded: list[Request | Chunks | End] = []

        def decode() -> None:
            found = messages.decode_for_shard(split_frames(message))
            if not isinstance(found, Request | Chunks | End):
                raise HandoffError(f"{type(found).__name__} is not sent to a shard")
            decoded.append(found)

        if not guarded(self.joiner.metrics, decode):
            # A request that does not decode is lost on every tap; an end, on the
            # taps still waiting for it; a chunk costs what the record misses.
            if kind == Kind.REQUEST.value:
                self.drop_all(DropReason.WORKER_ERROR)
                self.settle(key, done=True)
            elif kind == Kind.END.value:
                for tap in self.waiting(key):
                    self.outbox.drop(tap, DropReason.WORKER_ERROR)
                self.forget(key)
            return True
        match decoded[0]:
            case Request() as request:
                self.on_request(request)
            case Chunks() as chunks:
                self.on_chunk(chunks)
            case End() as end:
                self.on_end(end)
        return True

    def on_request(self, request: Request) -> None:
        key = request.key
        now = time.monotonic_ns()
        if self.bound.late(request.arrival_mono_ns, now):
            self.late.labels(LateStage.INTAKE).inc()
            self.drop_all(DropReason.LATE)
            self.settle(key, done=True)
            return
        self.intake_lag.observe((now - request.arrival_mono_ns) / 1e9)
        self.requests += 1
        self.outbox.touched = 0
        started = time.thread_time()
        ok = guarded(self.joiner.metrics, lambda: self.joiner.handle(request))
        cost = time.thread_time() - started
        pending = self.joiner.pending
        if not ok:
            untouched = self.all_taps & ~self.outbox.touched & ~self.mask(key)
            self.drop_all(DropReason.WORKER_ERROR, untouched)
        if key in pending:
            self.open[key] = cost
            self.settle(key, done=False)
        else:
            self.settle(key, done=True)
        if len(self.open) > len(pending):  # the joiner gave up its oldest (max_in_flight)
            for old in [k for k in self.open if k not in pending]:
                self.forget(old)

    def on_chunk(self, chunks: Chunks) -> None:
        key = chunks.key
        pending = self.joiner.pending.get(key)
        recorder = pending.recorder if pending is not None else None
        if recorder is None:
            return  # only the end matters (prompt-token check)
        if self.open[key] > self.max_cpu_s:
            recorder.give_up(self.cpu_reason, WorkBudget.CPU)
            self._count_budget(key, recorder)
            return
        started = self.set_deadline(key, recorder)
        guarded(self.joiner.metrics, lambda: self.joiner.handle(chunks))
        self.open[key] += time.thread_time() - started
        self._count_budget(key, recorder)

    def on_end(self, end: End) -> None:
        key = end.key
        joiner = self.joiner
        pending = joiner.pending.get(key)
        if pending is None:
            self.forget(key)
            return
        ready_ns = pending.arrival_mono_ns + end.offset_ns
        mask = self.mask(key)
        if mask and self.bound.late(ready_ns, time.monotonic_ns()):
            self.late.labels(LateStage.END).inc()
            for part in pending.parts():
                for tap in part.joined:
                    self.outbox.drop(tap.index, DropReason.LATE)
            joiner.pending.pop(key, None)
        else:
            recorder = pending.recorder
            if recorder is not None:  # the end may carry the body's last bytes
                self.set_deadline(key, recorder)
            self.outbox.touched = 0
            if not guarded(joiner.metrics, lambda: joiner.handle(end)):
                for part in pending.parts():
                    for tap in part.joined:
                        if mask & ~self.outbox.touched & 1 << tap.index:
                            self.outbox.drop(tap.index, DropReason.WORKER_ERROR)
            if recorder is not None and end.end is not EndKind.CAPTURE_LOST:
                self._count_budget(key, recorder)
        self.forget(key)

    def set_deadline(self, key: bytes, recorder: ResponseRecorder) -> float:
        """The request's CPU budget also holds between the decoded pieces of one
        message: a small chunk of a compressed body can take seconds to parse
        (the recorder reads the clock per ``CLOCK_BYTES``). A budget spent
        already stops the reading here. Returns the thread CPU time now."""
        now = time.thread_time()
        spent = self.open.get(key, 0.0)
        recorder.cpu_deadline = now + self.max_cpu_s - spent
        recorder.cpu_reason = self.cpu_reason
        if spent > self.max_cpu_s:  # spent already: nothing more is read
            recorder.give_up(self.cpu_reason, WorkBudget.CPU)
        return now

    def _count_budget(self, key: bytes, recorder: ResponseRecorder) -> None:
        if recorder.gave_up_on is not None and key not in self.gave_up:
            self.gave_up.add(key)
            self.budget_exceeded.labels(recorder.gave_up_on).inc()

    def forget(self, key: bytes) -> None:
        self.open.pop(key, None)
        self.gave_up.discard(key)
        self.joiner.pending.pop(key, None)
        self.settle(key, done=True)

    @property
    def all_taps(self) -> int:
        return (1 << len(self.joiner.taps)) - 1

    def finish(self) -> None:
        """Open requests get their ``shutdown`` records; all are settled."""
        self.joiner.finish_pending()
        for key in list(self.open):
            self.forget(key)

    # -- the loop -------------------------------------------------------------------

    def rss_mb(self) -> int:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)

    def report(self) -> None:
        self.outbox.counted = False
        self.outbox.send(messages.Metrics(self.joiner.metrics.tally.families()))

    def idle(self) -> None:
        """Nothing waits to be read: the metrics now, right after the records,
        drops or skips they count (the main relays both in one snapshot). Busy,
        or nothing counted since the last report: once a second (``periodic``)."""
        if self.outbox.counted:
            self.report()

    def periodic(self) -> None:
        self.report()
        # Between requests (this runs between messages): over the bound after it
        # has served, the shard asks to be replaced, again every RETIRE_ASK_S.
        now = time.monotonic()
        if self.max_rss_mb is not None and self.requests and now >= self.retire_asked:
            rss = self.rss_mb()
            if rss > self.max_rss_mb:
                self.retire_asked = now + RETIRE_ASK_S
                self.outbox.send(messages.Retire(rss))

    def run(self) -> None:
        decoder = StreamDecoder()
        poller = select.poll()
        poller.register(self.outbox.sock, select.POLLIN)
        next_snapshot = time.monotonic()
        running = True
        while running:
            now = time.monotonic()
            if now >= next_snapshot:
                next_snapshot = now + SNAPSHOT_S
                self.periodic()
                self.outbox.flush()
            if not poller.poll(max(0, (next_snapshot - now) * 1000)):
                continue
            data = self.outbox.sock.recv(READ_BYTES)
            if not data:
                break
            for message in decoder.feed(data):
                if not self.on_message(message):
                    running = False
                    break
            if running and not poller.poll(0):
                self.idle()
            self.outbox.flush()
        self.finish()
        self.periodic()
        self.outbox.flush()


def run(config: Config, token: int, path: str, processes: int) -> int:
    """A shard's life (``lifeline.spawn`` runs it): connect, load, serve, exit."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s shard: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's main decides when to stop
    try:  # under memory pressure the kernel kills a shard (counted, restarted) first
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE_ADJ))
    except OSError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    outbox = Outbox(sock)
    outbox.send(messages.Hello(token, os.getpid()))
    outbox.flush()
    worker = config.worker
    try:
        models = load_models(config)
    except ModelLoadError as e:
        outbox.send(messages.Failed(str(e)))
        outbox.flush()
        return 1
    share = max(1, worker.max_in_flight // processes)
    joiner = Joiner(config, models, outbox, max_in_flight=share)
    loop = ShardLoop(config, joiner, outbox)
    idle = worker.priority is Priority.IDLE
    achieved = priority.lower_priority(fallback_nice=worker.nice, idle=idle)
    ready = messages.Ready(
        os.getpid(), achieved.policy, achieved.fallback_reason, allocator.in_use()
    )
    outbox.send(ready)
    outbox.flush()
    try:
        loop.run()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the main is gone
    return 0
