"""The join: hand-off messages in, one offer per request per tap out. No sockets.

Runs in the tap worker process (``worker/main.py`` feeds it and publishes the
queues). Per request:

1. on the request message: preprocess once, decide per tap (models, select
   filters, sample), offer ``capture: request`` records at once, keep the
   request for joined taps and for the prompt-token check;
2. on chunk messages: feed the response recorder (joined taps only);
3. on the end message: decide the outcome, tokenize each choice once, offer
   each joined tap its record built from the shared projection.

Guarantees: one record per request per tap that takes it, or one counted drop
with a reason (its ``seq`` taken, so the consumer sees the gap). A batch
completions request is one record per prompt (``worker/request/batch.py``):
each prompt is taken or skipped by each tap on its own, and each record takes
its own ``seq``; the records share the request id and carry ``prompt_index``.
"""

from __future__ import annotations

import collections
import functools
import logging
import re
import time
from typing import Any

import attrs

from shadow_proxy.channel import frames as hf
from shadow_proxy.channel import headers as engine_headers
from shadow_proxy.config import Config, TapConfig
from shadow_proxy.exchange import EndKind, Route
from shadow_proxy.records.envelope import build_envelope
from shadow_proxy.records.filters import prefix_sample_key, request_sample_key, sample_in
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.records.wire import WireError
from shadow_proxy.worker.budget import response_events
from shadow_proxy.worker.encoding import encode_record
from shadow_proxy.worker.metrics import WorkerMetrics
from shadow_proxy.worker.request.batch import PreprocessedBatch
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import LoadedModel
from shadow_proxy.worker.response.batch import for_prompt
from shadow_proxy.worker.response.recorder import ResponseRecorder
from shadow_proxy.worker.tap_queue import TapQueue

log = logging.getLogger(__name__)

#: ``usage.prompt_tokens`` (Responses: ``usage.input_tokens``) in a response's last chunks.
_PROMPT_TOKENS_RE = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')


@attrs.define
class Tap:
    config: TapConfig
    queue: TapQueue


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
    #: Batch completions: this record's prompt, and (on the first prompt's
    #: Pending, the one tracked) the Pendings of the other prompts, in order.
    prompt_index: int | None = None
    batch: list[Pending] = attrs.field(factory=list)

    def parts(self) -> list[Pending]:
        """The Pending of each record this request yields, in prompt order."""
        return [self, *self.batch]


class Joiner:
    """Turns hand-off messages into tap offers; owns no socket.

    ``handle`` takes one hand-off message (its frames). Guarantees: for every
    request handed over, each tap that takes it gets exactly one offer (its
    record) or one counted drop, whatever the response does; requests a tap
    does not take are counted as skips. Publishing the queues is the caller's.
    """

    def __init__(self, config: Config, models: dict[str, LoadedModel]):
        self.config = config
        self.models = models
        self.preprocessor = Preprocessor(models, config.upstream.max_request_bytes)
        self.taps = [Tap(c, TapQueue(c)) for c in config.taps]
        self.metrics = WorkerMetrics([t.queue for t in self.taps])
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
        headers = engine_headers.unpack(frames[3]) if len(frames) > 3 else []
        encoding = hf.unpack_encoding(frames)  # the worker decodes its own copy, bounded
        pre = self.preprocessor.preprocess(route, frames[2], arrival_unix_ns, headers, encoding)
        self.metrics.preprocess_seconds.labels(route.label).observe(time.perf_counter() - started)
        if not isinstance(pre, (PreprocessedRequest, PreprocessedBatch)):
            self.metrics.not_mirrored.labels(pre.reason).inc()
            return
        many = isinstance(pre, PreprocessedBatch)
        parts = [
            Pending(
                route,
                request_id,
                arrival_unix_ns,
                one,
                [],
                None,
                model=one.model,
                prompt_tokens=len(one.token_ids),
                arrival_mono_ns=arrival_mono_ns,
                prompt_index=index if many else None,
            )
            for index, one in enumerate(pre.requests if many else (pre,))
        ]
        pending = parts[0]
        pending.batch = parts[1:]
        for part in parts:
            for tap in self.taps:
                try:
                    taken = self.takes(tap, part)
                except Exception as exc:  # this tap's filters failed: its loss only
                    self.tap_failed(tap, exc)
                    continue
                if not taken:
                    continue
                if tap.config.joined:
                    part.joined.append(tap)
                else:
                    self.publish(tap, part, None)
        joined = [tap for part in parts for tap in part.joined]
        if joined:
            pre = pending.pre
            n = pre.sampling_options.get("n") or 1
            options = [t.config.response for t in joined]
            caps = [o.max_tokens for o in options]
            pending.recorder = ResponseRecorder(
                route,
                n * len(parts),
                # Upstream ids beyond every tap's cap are never published.
                max_token_ids_per_choice=None if None in caps else max(caps),
                chunk_timing=any(o.chunk_timing for o in options),
                max_decoded_bytes=self.config.worker.max_decoded_bytes,
                max_events=response_events(
                    n * len(parts),
                    pre.stop_conditions.get("max_tokens"),
                    self.models[pre.model].context_length,
                ),
            )
        for part in parts:
            if not part.joined:
                # Only the prompt-token check waits for the end: keep the request slim.
                part.pre = None
                part.projections.clear()
        self.track(key, pending)

    def track(self, key: bytes, pending: Pending) -> None:
        self.pending[key] = pending
        while len(self.pending) > self.max_in_flight:
            _, oldest = self.pending.popitem(last=False)
            self.metrics.evicted.inc()
            for part in oldest.parts():
                for tap in part.joined:
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
        parts = pending.parts()
        if end is EndKind.CAPTURE_LOST:
            for part in parts:
                for tap in part.joined:
                    tap.queue.drop("handoff_full")
            return
        # A response read no further past a work budget is not encoded either:
        # its text (up to the recorder's caps, megabytes) would cost seconds more.
        cut = pending.recorder.gave_up is not None
        observed = pending.recorder.finish(end, offset, detail)
        pending.recorder = None
        model = self.models[pending.model]
        joined = [tap for part in parts for tap in part.joined]
        # A chat request that names its session is a conversation whose next turn
        # comes to this shard: the answer's ids are kept for it.
        pre = pending.pre
        conversation = (
            pending.route is not Route.COMPLETIONS and pre is not None and bool(pre.agent_context)
        )
        final = observed.finalize(
            None if cut else functools.partial(model.encode_output, conversation=conversation),
            token_ids=any(t.config.response.tokens for t in joined),
        )
        self.check_prompt_tokens(pending, reported_prompt_tokens(observed.usage))
        if observed.first_token_offset_ns is not None:
            self.metrics.ttft.observe(observed.first_token_offset_ns / 1e9)
        for part in parts:
            answer = final
            if part.prompt_index is not None:
                answer = for_prompt(final, part.prompt_index, observed.n // len(parts))
            for tap in part.joined:
                options = tap.config.response
                try:
                    response = answer.to_record(
                        tokens=options.tokens,
                        text=options.text,
                        max_tokens=options.max_tokens,
                        chunk_timing=options.chunk_timing,
                    )
                except Exception as exc:  # this tap's record failed: its loss only
                    self.tap_failed(tap, exc)
                    continue
                self.publish(tap, part, response)

    def check_prompt_tokens(self, pending: Pending, reported: Any) -> None:
        """The frontend's prompt count against the rebuilt one (a batch's usage
        is summed over its prompts, so is the rebuilt count)."""
        if type(reported) is not int:
            return
        model = pending.model
        self.metrics.prompt_checks.labels(model).inc()
        if reported != sum(part.prompt_tokens for part in pending.parts()):
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

    def tap_failed(self, tap: Tap, exc: Exception) -> None:
        """One tap's filters, projection or response failed on a request: that tap
        loses the record (counted, its seq taken); no other tap is affected."""
        tap.queue.drop("projection_error")
        log.warning("tap %s: record dropped (%s)", tap.config.name, type(exc).__name__)

    def publish(self, tap: Tap, pending: Pending, response: dict | None) -> None:
        """Project (shared by taps with equal filters), build, encode and offer one
        tap's record. A failure costs this tap one counted drop
        (``projection_error`` or ``encode_error``) and nothing else."""
        config = tap.config
        projection_key = config.filters.projection_key
        request = pending.projections.get(projection_key)
        if request is None:
            try:
                request = config.filters.project(pending.pre)
            except Exception as exc:  # RecursionError, ProjectionError, a bug
                self.tap_failed(tap, exc)
                return
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
            prompt_index=pending.prompt_index,
        )
        try:
            payload = encode_record(envelope)
        except (WireError, RecursionError):
            tap.queue.dropped["encode_error"] += 1
            return
        tap.queue.offer(payload)

    def finish_pending(self) -> None:
        """At shutdown: requests still open get their record as ``shutdown``."""
        for pending in list(self.pending.values()):
            if pending.recorder is not None:
                offset = max(0, time.monotonic_ns() - pending.arrival_mono_ns)
                self.on_end(pending, EndKind.SHUTDOWN, offset, "proxy shut down", [])
        self.pending.clear()


def reported_prompt_tokens(usage: dict[str, Any] | None) -> Any:
    """The frontend's prompt count: ``usage.prompt_tokens``, or the Responses
    API's ``usage.input_tokens``."""
    usage = usage or {}
    return usage.get("prompt_tokens", usage.get("input_tokens"))


def _head_args(head: tuple[int, int, str, str, int]) -> tuple[int, str, str, int, int]:
    status, offset, content_type, content_encoding, sent = head
    return status, content_type, content_encoding, offset, sent
