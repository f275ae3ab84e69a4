"""The tap worker: a separate process that turns handed-off exchanges into records.

Runs in its own process (spawned by ``supervisor.py``), so its CPU never takes
the serving loop's GIL. One thread, one loop:

1. read hand-off messages (request, head, chunk, end) from the PULL socket;
2. on a request: preprocess it once, decide per tap (models, select filters,
   sample), publish ``capture: request`` records at once, keep the request
   for joined taps and the prompt-token check;
3. on chunks: feed the response recorder (joined taps only);
4. on the end: decide the outcome, tokenize each choice once, build each
   joined tap's record from the shared projection;
5. pump each tap's queue into its publisher; every second send heartbeats
   and a metrics snapshot to the serving process.

Guarantees: one record per request per tap that takes it, or one counted drop
with a reason (its ``seq`` taken, so the consumer sees the gap). A failure in
any step is caught and counted here; the client never knows.
"""

from __future__ import annotations

# TRANSITIONAL (branch nats, before the issue-11 layout lands): lets the new modules
# under shadow_proxy/worker/ import while this file is still a module.
# Delete these two lines when this module moves into the package.
__path__ = [__file__.removesuffix(".py")]

import collections
import logging
import os
import re
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import attrs
import msgpack
import zmq
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shadow_proxy import handoff as hf
from shadow_proxy.config import Config, TapConfig
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.filters import prefix_sample_key, request_sample_key, sample_in
from shadow_proxy.metrics import LATENCY_BUCKETS
from shadow_proxy.preprocess import Preprocessor
from shadow_proxy.preprocessed import PreprocessedRequest
from shadow_proxy.publisher import Publisher
from shadow_proxy.recorder import ResponseRecorder
from shadow_proxy.records import build_envelope
from shadow_proxy.tap import TapQueue
from shadow_proxy.tokenizer import LoadedModel, ModelLoadError, load_model
from shadow_proxy.wire import WireError, encode_envelope

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
#: How long the queues are drained at shutdown before what is left is lost.
DRAIN_S = 2.0

PREPROCESS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_PROMPT_TOKENS_RE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


@attrs.define
class Tap:
    config: TapConfig
    queue: TapQueue
    publisher: Publisher


@attrs.define
class Pending:
    """A request whose response has not ended yet."""

    route: Route
    request_id: str
    arrival_unix_ns: int
    #: The preprocessed request, kept only while a joined tap needs it.
    pre: PreprocessedRequest | None
    joined: list[Tap]
    recorder: ResponseRecorder | None
    model: str = ""
    prompt_tokens: int = 0
    projections: dict[Any, dict] = attrs.field(factory=dict)
    #: The serving process's monotonic arrival stamp (CLOCK_MONOTONIC is
    #: system-wide), for offsets the worker itself must take.
    arrival_mono_ns: int = 0


class WorkerMetrics(Collector):
    """The worker's metrics; the snapshot is relayed to the serving process."""

    def __init__(self, taps: list[Tap]):
        self.taps = taps
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.preprocess_seconds = Histogram(
            "shadow_preprocess_seconds",
            "Time to rebuild the preprocessed request (template and tokenizer).",
            ["route"],
            buckets=PREPROCESS_BUCKETS,
            registry=self.registry,
        )
        self.not_mirrored = Counter(
            "shadow_not_mirrored",
            "Mirrored-route requests that yield no record, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.prompt_checks = Counter(
            "shadow_prompt_token_checks",
            "Responses whose usage.prompt_tokens was compared with the rebuilt prompt.",
            ["model"],
            registry=self.registry,
        )
        self.prompt_mismatches = Counter(
            "shadow_prompt_token_mismatches",
            "Responses whose usage.prompt_tokens differs from the rebuilt prompt length.",
            ["model"],
            registry=self.registry,
        )
        self.failures = Counter(
            "shadow_worker_failures",
            "Hand-off messages the worker could not process, by exception type (a bug).",
            ["exception"],
            registry=self.registry,
        )
        self.evicted = Counter(
            "shadow_worker_evicted",
            "Unfinished requests the worker stopped tracking (worker.max_in_flight).",
            registry=self.registry,
        )
        self.ttft = Histogram(
            "shadow_worker_record_ttft_seconds",
            "Arrival to the first content-carrying chunk, in joined records.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def collect(self):
        labels = ["tap"]
        queued = CounterMetricFamily(
            "shadow_tap_queued", "Records put on the tap's queue.", labels=labels
        )
        published = CounterMetricFamily(
            "shadow_tap_published", "Records sent on the tap's socket.", labels=labels
        )
        dropped = CounterMetricFamily(
            "shadow_tap_dropped", "Records lost, by reason.", labels=["tap", "reason"]
        )
        errors = CounterMetricFamily(
            "shadow_tap_publish_errors", "Sends that failed.", labels=labels
        )
        skipped = CounterMetricFamily(
            "shadow_tap_skipped",
            "Requests the tap did not take (filters, sample, models): not a loss.",
            labels=["tap", "reason"],
        )
        depth = GaugeMetricFamily("shadow_tap_queue_depth", "Records waiting.", labels=labels)
        for tap in self.taps:
            q, name = tap.queue, tap.config.name
            queued.add_metric([name], q.queued)
            published.add_metric([name], tap.publisher.published)
            errors.add_metric([name], tap.publisher.publish_errors)
            depth.add_metric([name], len(q.items))
            for reason, n in q.dropped.items():
                dropped.add_metric([name, reason], n)
            for reason, n in q.skipped.items():
                skipped.add_metric([name, reason], n)
        return [queued, published, dropped, errors, skipped, depth]

    def snapshot(self) -> list:
        """The registry's samples as plain data for the relay."""
        return [
            [family.name, family.type, family.documentation,
             [[s.name, s.labels, s.value] for s in family.samples]]
            for family in self.registry.collect()
        ]  # fmt: skip


class Worker:
    def __init__(
        self,
        config: Config,
        models: dict[str, LoadedModel],
        context: zmq.Context,
        link: Any = None,
    ):
        self.config = config
        self.models = models
        self.preprocessor = Preprocessor(models)
        self.taps = [Tap(c, q := TapQueue(c), _publisher(context, q, link)) for c in config.taps]
        self.metrics = WorkerMetrics(self.taps)
        if link is not None:
            self.metrics.registry.register(link.metrics)
        self.pending: collections.OrderedDict[bytes, Pending] = collections.OrderedDict()
        self.max_in_flight = config.worker.max_in_flight
        self.lost_seen = 0

    # -- hand-off messages -------------------------------------------------------

    def handle(self, frames: list[bytes]) -> None:
        kind, key, meta = hf.split_header(frames[0])
        if kind == hf.KIND_REQUEST:
            self.on_request(key, meta, frames)
        elif kind == hf.KIND_CHUNK:
            pending = self.pending.get(key)
            if pending is not None and pending.recorder is not None:
                self.feed(pending.recorder, frames[1], hf.unpack_chunks(frames[2], frames[3]))
        elif kind == hf.KIND_END:
            pending = self.pending.pop(key, None)
            if pending is not None:
                end, offset = hf.END_META.unpack(meta)
                pairs = hf.unpack_chunks(frames[3], frames[4])
                if pending.recorder is not None and end != EndKind.CAPTURE_LOST:
                    self.feed(pending.recorder, frames[1], pairs)
                tail = [data for data, _ in pairs]
                self.on_end(pending, EndKind(end), offset, frames[2].decode(), tail)

    @staticmethod
    def feed(recorder: ResponseRecorder, head: bytes, pairs: list[tuple[bytes, int]]) -> None:
        """The response head (if this message carries it), then the chunks."""
        started = hf.unpack_head(head)
        if started is not None:
            recorder.head(*_head_args(started))
        for data, offset in pairs:
            recorder.feed(data, offset)

    def on_request(self, key: bytes, meta: bytes, frames: list[bytes]) -> None:
        route_value, arrival_unix_ns, arrival_mono_ns, lost_before = hf.REQUEST_META.unpack(meta)
        if lost_before > self.lost_seen:
            # Requests the serving loop could not hand over: every tap loses them.
            for tap in self.taps:
                tap.queue.drop("handoff_full", lost_before - self.lost_seen)
            self.lost_seen = lost_before
        route = Route(route_value)
        request_id = frames[1].decode("utf-8", "replace")
        started = time.perf_counter()
        pre = self.preprocessor.preprocess(route, frames[2], arrival_unix_ns)
        self.metrics.preprocess_seconds.labels(route.label).observe(time.perf_counter() - started)
        if not isinstance(pre, PreprocessedRequest):
            self.metrics.not_mirrored.labels(pre.reason).inc()
            return
        pending = Pending(
            route,
            request_id,
            arrival_unix_ns,
            pre,
            [],
            None,
            model=pre.model,
            prompt_tokens=len(pre.token_ids),
            arrival_mono_ns=arrival_mono_ns,
        )
        for tap in self.taps:
            if not self.takes(tap, pending):
                continue
            if tap.config.joined:
                pending.joined.append(tap)
            else:
                self.publish(tap, pending, None)
        if pending.joined:
            n = pre.sampling_options.get("n") or 1
            options = [t.config.response for t in pending.joined]
            caps = [o.max_tokens for o in options]
            pending.recorder = ResponseRecorder(
                route,
                n,
                # Upstream ids beyond every tap's cap are never published.
                max_token_ids_per_choice=None if None in caps else max(caps),
                chunk_timing=any(o.chunk_timing for o in options),
            )
        else:
            # Only the prompt-token check waits for the end: keep the request slim.
            pending.pre = None
            pending.projections.clear()
        self.track(key, pending)

    def track(self, key: bytes, pending: Pending) -> None:
        self.pending[key] = pending
        while len(self.pending) > self.max_in_flight:
            _, oldest = self.pending.popitem(last=False)
            self.metrics.evicted.inc()
            for tap in oldest.joined:
                tap.queue.drop("evicted")

    def takes(self, tap: Tap, pending: Pending) -> bool:
        config, pre = tap.config, pending.pre
        if config.models and pre.model not in config.models:
            tap.queue.skip("models")
            return False
        reason = config.filters.select(pre)
        if reason is not None:
            tap.queue.skip(reason)
            return False
        if config.sample < 1.0:
            key = (
                prefix_sample_key(pre.token_ids)
                if config.sample_by == "prefix"
                else request_sample_key(pending.request_id)
            )
            if not sample_in(key, config.sample):
                tap.queue.skip("sample")
                return False
        return True

    def on_end(
        self, pending: Pending, end: EndKind, offset: int, detail: str, tail: list[bytes]
    ) -> None:
        if pending.recorder is None:
            self.check_prompt_tokens_in_tail(pending, tail)
            return
        if end is EndKind.CAPTURE_LOST:
            for tap in pending.joined:
                tap.queue.drop("handoff_full")
            return
        observed = pending.recorder.finish(end, offset, detail)
        pending.recorder = None
        model = self.models[pending.model]
        final = observed.finalize(
            model.encode, token_ids=any(t.config.response.tokens for t in pending.joined)
        )
        usage = observed.usage or {}
        self.check_prompt_tokens(pending, usage.get("prompt_tokens"))
        if observed.first_token_offset_ns is not None:
            self.metrics.ttft.observe(observed.first_token_offset_ns / 1e9)
        for tap in pending.joined:
            options = tap.config.response
            response = final.to_record(
                tokens=options.tokens,
                text=options.text,
                max_tokens=options.max_tokens,
                chunk_timing=options.chunk_timing,
            )
            self.publish(tap, pending, response)

    def check_prompt_tokens(self, pending: Pending, reported: Any) -> None:
        if type(reported) is not int:
            return
        model = pending.model
        self.metrics.prompt_checks.labels(model).inc()
        if reported != pending.prompt_tokens:
            self.metrics.prompt_mismatches.labels(model).inc()

    def check_prompt_tokens_in_tail(self, pending: Pending, tail: list[bytes]) -> None:
        """Without joined taps only the response's last chunks reach the worker;
        ``usage`` is there when the frontend reports it."""
        if not tail:
            return
        matches = _PROMPT_TOKENS_RE.findall(b"".join(tail))
        if matches:
            self.check_prompt_tokens(pending, int(matches[-1]))

    # -- records -----------------------------------------------------------------

    def publish(self, tap: Tap, pending: Pending, response: dict | None) -> None:
        config = tap.config
        projection_key = config.filters.projection_key
        request = pending.projections.get(projection_key)
        if request is None:
            request = config.filters.project(pending.pre)
            pending.projections[projection_key] = request
        seq = tap.queue.take_seq()
        envelope = build_envelope(
            tap=config.name,
            seq=seq,
            request_id=pending.request_id,
            origin=pending.route.origin,
            filters=config.filters.names,
            arrival_unix_ns=pending.arrival_unix_ns,
            sample_rate=config.sample,
            request=request,
            response=response,
        )
        try:
            payload = encode_envelope(envelope)
        except WireError:
            tap.queue.dropped["encode_error"] += 1
            return
        tap.queue.offer(payload)

    # -- the loop ----------------------------------------------------------------

    def pump(self) -> bool:
        waiting = False
        for tap in self.taps:
            if tap.queue.items:
                waiting |= tap.publisher.pump()
            else:
                tap.publisher.drain_subscriptions()
        return waiting

    def heartbeat(self) -> None:
        for tap in self.taps:
            tap.publisher.heartbeat()

    def finish_pending(self) -> None:
        """At shutdown: requests still open get their record as ``shutdown``."""
        for pending in list(self.pending.values()):
            if pending.recorder is not None:
                offset = max(0, time.monotonic_ns() - pending.arrival_mono_ns)
                self.on_end(pending, EndKind.SHUTDOWN, offset, "proxy shut down", [])
        self.pending.clear()

    def drain(self, deadline_s: float) -> int:
        """Publish what is queued for up to ``deadline_s``; returns what was lost."""
        deadline = time.monotonic() + deadline_s
        while (self.pump() or self.in_flight()) and time.monotonic() < deadline:
            time.sleep(RETRY_MS / 1000)
        lost = 0
        for tap in self.taps:
            lost += tap.queue.close()
        return lost

    def in_flight(self) -> int:
        """Records handed to a transport and not yet confirmed (JetStream acks)."""
        return sum(tap.publisher.in_flight for tap in self.taps)

    def listing(self) -> list[dict]:
        return [
            {
                "name": t.config.name,
                "topic": t.config.topic,
                "endpoint": t.publisher.endpoint,
                "capture": t.config.capture,
                "filters": list(t.config.filters.names),
                "models": list(t.config.models),
                "sample": t.config.sample,
                "capacity": t.config.capacity,
                "transport": t.config.transport,
                **({"subject": t.config.subject} if t.config.subject else {}),
                "publisher_id": t.publisher.publisher_id,
                "next_seq": t.queue.next_seq,
                "queued": t.queue.queued,
                "published": t.publisher.published,
                "dropped": dict(t.queue.dropped),
                "skipped": dict(t.queue.skipped),
                "publish_errors": t.publisher.publish_errors,
                "queue_depth": len(t.queue.items),
            }
            for t in self.taps
        ]


def _publisher(context: zmq.Context, queue: TapQueue, link: Any) -> Any:
    """The tap's publisher: its PUB socket, or its share of the JetStream link."""
    if queue.config.transport == "nats":
        return link.publisher(queue)
    return Publisher(context, queue)


def _jetstream_link(config: Config) -> Any:
    """The JetStream link when a tap publishes to NATS (None otherwise); it starts
    connecting now, while the tokenizers load. Imported only then: nats-py is
    not loaded by a worker without NATS taps."""
    if not any(tap.transport == "nats" for tap in config.taps):
        return None
    from shadow_proxy.worker.publishers.jetstream import JetStreamLink

    return JetStreamLink.for_config(config)


def _load_models(config: Config) -> dict[str, LoadedModel]:
    return {
        entry.name: load_model(entry.name, entry.tokenizer, entry.context_length)
        for entry in config.models
    }


def run(config: Config, handoff_endpoint: str, control_endpoint: str) -> int:
    """The worker process's main: load, say ready (or why not), loop until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s worker: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the serving process decides when to stop
    if config.worker.nice:
        os.nice(config.worker.nice)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))

    context = zmq.Context()
    control = context.socket(zmq.PUSH)
    control.setsockopt(zmq.LINGER, 1000)
    control.setsockopt(zmq.SNDHWM, 16)
    control.connect(control_endpoint)

    def say(kind: str, **fields: Any) -> bool:
        try:
            control.send(msgpack.packb({"kind": kind, **fields}), flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    link = _jetstream_link(config)
    try:
        worker = Worker(config, _load_models(config), context, link)
        problem = link.startup_problem() if link is not None else None
    except (ModelLoadError, zmq.ZMQError, OSError) as e:
        problem = str(e) if isinstance(e, ModelLoadError) else f"tap socket: {e}"
    if problem is not None:
        say("error", message=problem)
        if link is not None:
            link.close()
        control.close(linger=1000)
        context.term()
        return 1

    pull = context.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, config.worker.handoff_capacity)
    pull.setsockopt(zmq.LINGER, 0)
    pull.connect(handoff_endpoint)
    say("ready", taps=worker.listing())

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
                _safely(worker, frames)
        waiting = worker.pump()
        now = time.monotonic()
        if received != reported and now >= next_progress and say("progress", bytes=received):
            reported, next_progress = received, now + PROGRESS_S
        if now >= next_beat:
            next_beat = now + HEARTBEAT_S
            worker.heartbeat()
            families = worker.metrics.snapshot()
            say("metrics", families=families, taps=worker.listing(), bytes=received)

    # Shutdown: what the serving loop sent before it stopped (up to its last
    # message, which may still be in transit), then the queues.
    deadline = time.monotonic() + LAST_MESSAGE_WAIT_S
    while time.monotonic() < deadline:
        if not pull.poll(50):
            continue
        frames = pull.recv_multipart()
        if frames[0][:1] == hf.KIND_LAST:
            break
        _safely(worker, frames)
    worker.finish_pending()
    lost = worker.drain(DRAIN_S)
    worker.heartbeat()
    say("metrics", families=worker.metrics.snapshot(), taps=worker.listing())
    if lost:
        log.warning("shutdown: %d queued record(s) lost after the %.0fs drain", lost, DRAIN_S)
    for tap in worker.taps:
        tap.publisher.close()
    pull.close()
    control.close(linger=1000)
    context.term()
    return 0


def _head_args(head: tuple[int, int, str, str]) -> tuple[int, str, str, int]:
    status, offset, content_type, content_encoding = head
    return status, content_type, content_encoding, offset


def _safely(worker: Worker, frames: list[bytes]) -> None:
    """A malformed message or a bug in one record costs that record only. The
    log line names the exception type and where it was raised, never its
    message (which could quote client text)."""
    try:
        worker.handle(frames)
    except Exception as e:  # a bug in a record's building must not stop the worker
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        kind = type(e)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        worker.metrics.failures.labels(name).inc()
        log.error("hand-off message dropped: %s at %s", name, where)
