"""The join: hand-off messages in, one offer per request per tap out. No sockets.

Runs in a shard (``worker/shard/loop.py`` decodes the hand-off messages the main
routes to it and hands them over; the joiner publishes into the ``RecordSink``
it was given, ``worker/sink.py``). Per request:

1. on the request message: preprocess once, decide per tap (models, select
   filters, sample), offer ``capture: request`` records at once, keep the
   request for joined taps and for the prompt-token check;
2. on chunk messages: feed the response recorder (joined taps only);
3. on the end message: decide the outcome, tokenize each choice once, offer
   each joined tap its record built from the shared projection.

Guarantees: one record per request per tap that takes it, or one counted drop
with a reason (the sink takes its ``seq``, so the consumer sees the gap). A batch
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

from shadow_proxy.channel import headers as engine_headers
from shadow_proxy.channel.handoff import Chunks, End, Head, Pieces, Request
from shadow_proxy.config import Config, ResponseOptions, SampleBy, TapConfig
from shadow_proxy.exchange import DropReason, EndKind, Route
from shadow_proxy.records.envelope import build_envelope
from shadow_proxy.records.filters import prefix_sample_key, request_sample_key, sample_in
from shadow_proxy.records.preprocessed import PreprocessedRequest
from shadow_proxy.records.wire import WireError
from shadow_proxy.worker.budget import response_events
from shadow_proxy.worker.request.batch import PreprocessedBatch
from shadow_proxy.worker.request.preprocess import Preprocessor
from shadow_proxy.worker.request.tokenizer import LoadedModel
from shadow_proxy.worker.response.batch import for_prompt
from shadow_proxy.worker.response.recorder import ResponseRecorder
from shadow_proxy.worker.shard.encoding import Packed, encode_record
from shadow_proxy.worker.shard.metrics import JoinerMetrics
from shadow_proxy.worker.sink import RecordSink

log = logging.getLogger(__name__)

#: ``usage.prompt_tokens`` (Responses: ``usage.input_tokens``) in a response's last chunks.
_PROMPT_TOKENS_RE = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')


@attrs.frozen
class Tap:
    #: Its index in ``config.taps``: how the sink knows it.
    index: int
    config: TapConfig
    #: What a joined record keeps of the response (the defaults for a request tap).
    response: ResponseOptions = attrs.field()

    @response.default
    def _response(self) -> ResponseOptions:
        return self.config.response or ResponseOptions()


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
    #: The request map's long lists (the prompt's ids) as packed for the first
    #: record, reused by the others (``encoding.encode_record``).
    packed: Packed = attrs.field(factory=dict)

    def parts(self) -> list[Pending]:
        """The Pending of each record this request yields, in prompt order."""
        return [self, *self.batch]


class Joiner:
    """Turns hand-off messages into records published into ``sink``; owns no socket.

    ``handle`` takes one decoded hand-off message. Guarantees: for every request
    handed over, each tap that takes it gets exactly one record or one counted
    drop, whatever the response does; requests a tap does not take are counted
    as skips. What the serving loop could not hand over at all is the main's to
    count (``Request.lost_before``: it sees every request, a shard only its own).
    """

    def __init__(
        self,
        config: Config,
        models: dict[str, LoadedModel],
        sink: RecordSink,
        *,
        max_in_flight: int | None = None,
        metrics: JoinerMetrics | None = None,
    ):
        self.config = config
        self.models = models
        self.sink = sink
        self.preprocessor = Preprocessor(models, config.upstream.max_request_bytes)
        self.taps = [Tap(index, c) for index, c in enumerate(config.taps)]
        self.metrics = JoinerMetrics() if metrics is None else metrics
        self.pending: collections.OrderedDict[bytes, Pending] = collections.OrderedDict()
        #: Requests tracked at once, awaiting their end (a shard's share of
        #: ``worker.max_in_flight``).
        self.max_in_flight = config.worker.max_in_flight if max_in_flight is None else max_in_flight

    # -- hand-off messages -------------------------------------------------------

    def handle(self, message: Request | Chunks | End) -> None:
        match message:
            case Request():
                self.on_request(message)
            case Chunks(key=key):
                pending = self.pending.get(key)
                if pending is not None and pending.recorder is not None:
                    self.feed(pending.recorder, message.head, message.offsets, message.data)
            case End(key=key, end=end):
                pending = self.pending.pop(key, None)
                if pending is not None:
                    if pending.recorder is not None and end is not EndKind.CAPTURE_LOST:
                        self.feed(pending.recorder, message.head, message.offsets, message.data)
                    self.on_end(
                        pending, end, message.offset_ns, message.detail, message.data.split()
                    )

    @staticmethod
    def feed(
        recorder: ResponseRecorder, head: Head | None, offsets: list[int], data: Pieces
    ) -> None:
        """The response head (if this message carries it), then the chunks."""
        if head is not None:
            recorder.head(
                head.status,
                head.content_type,
                head.content_encoding,
                head.offset_ns,
                head.sent_offset_ns,
            )
        recorder.feed_many(data, offsets)

    def on_request(self, message: Request) -> None:
        route = message.route
        request_id = message.request_id
        arrival_unix_ns, arrival_mono_ns = message.arrival_unix_ns, message.arrival_mono_ns
        started = time.perf_counter()
        headers = engine_headers.unpack(message.engine_headers)
        # The worker decodes its own copy of the body, bounded.
        pre = self.preprocessor.preprocess(
            route, message.body, arrival_unix_ns, headers, message.content_encoding
        )
        self.metrics.preprocess_seconds.labels(route.label).observe(time.perf_counter() - started)
        if not isinstance(pre, (PreprocessedRequest, PreprocessedBatch)):
            self.metrics.not_mirrored.labels(pre.reason).inc()
            return
        many = isinstance(pre, PreprocessedBatch)
        requests = pre.requests if isinstance(pre, PreprocessedBatch) else (pre,)
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
            for index, one in enumerate(requests)
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
                    self.publish(tap, part, None, arrival_mono_ns)
        joined = [tap for part in parts for tap in part.joined]
        if joined:
            first = requests[0]
            n = first.sampling_options.get("n") or 1
            options = [t.response for t in joined]
            caps = [o.max_tokens for o in options]
            pending.recorder = ResponseRecorder(
                route,
                n * len(parts),
                # Upstream ids beyond every tap's cap are never published.
                max_token_ids_per_choice=None
                if any(cap is None for cap in caps)
                else max(cap for cap in caps if cap is not None),
                chunk_timing=any(o.chunk_timing for o in options),
                max_decoded_bytes=self.config.worker.max_decoded_bytes,
                max_events=response_events(
                    n * len(parts),
                    first.stop_conditions.get("max_tokens"),
                    self.models[first.model].context_length,
                ),
            )
        for part in parts:
            if not part.joined:
                # Only the prompt-token check waits for the end: keep the request slim.
                part.pre = None
                part.projections.clear()
                part.packed.clear()
        self.track(message.key, pending)

    def track(self, key: bytes, pending: Pending) -> None:
        self.pending[key] = pending
        while len(self.pending) > self.max_in_flight:
            _, oldest = self.pending.popitem(last=False)
            self.metrics.evicted.inc()
            for part in oldest.parts():
                for tap in part.joined:
                    self.sink.drop(tap.index, DropReason.EVICTED)

    def takes(self, tap: Tap, pending: Pending) -> bool:
        config, pre = tap.config, pending.pre
        assert pre is not None  # kept until the taps have decided
        if config.models and pre.model not in config.models:
            self.sink.skip(tap.index, "models")
            return False
        reason = config.filters.select(pre)
        if reason is not None:
            self.sink.skip(tap.index, reason)
            return False
        if config.sample < 1.0:
            key = (
                prefix_sample_key(pre.token_ids)
                if config.sample_by is SampleBy.PREFIX
                else request_sample_key(pending.request_id)
            )
            if not sample_in(key, config.sample):
                self.sink.skip(tap.index, "sample")
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
                    self.sink.drop(tap.index, DropReason.HANDOFF_FULL)
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
            token_ids=any(t.response.tokens for t in joined),
        )
        self.check_prompt_tokens(pending, reported_prompt_tokens(observed.usage))
        ready = pending.arrival_mono_ns + offset
        if observed.first_token_offset_ns is not None:
            self.metrics.ttft.observe(observed.first_token_offset_ns / 1e9)
        for part in parts:
            answer = final
            if part.prompt_index is not None:
                answer = for_prompt(final, part.prompt_index, observed.n // len(parts))
            for tap in part.joined:
                options = tap.response
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
                self.publish(tap, part, response, ready)

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
        self.sink.drop(tap.index, DropReason.PROJECTION_ERROR)
        log.warning("tap %s: record dropped (%s)", tap.config.name, type(exc).__name__)

    def publish(
        self, tap: Tap, pending: Pending, response: dict | None, ready_mono_ns: int
    ) -> None:
        """Project (shared by taps with equal filters), build, encode and publish
        one tap's record, ready at ``ready_mono_ns`` (its lag counts from there). A
        failure costs this tap one counted drop (``projection_error`` or
        ``encode_error``) and nothing else."""
        config = tap.config
        projection_key = config.filters.projection_key
        request = pending.projections.get(projection_key)
        if request is None:
            try:
                if pending.pre is None:  # kept while a tap needs it: a bug otherwise
                    raise ValueError("no preprocessed request to project")
                request = config.filters.project(pending.pre)
            except Exception as exc:  # RecursionError, ProjectionError, a bug
                self.tap_failed(tap, exc)
                return
            pending.projections[projection_key] = request
        envelope = build_envelope(
            tap=config.name,
            seq=None,  # the sink's to take
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
            record = encode_record(envelope, pending.packed)
        except (WireError, RecursionError):
            self.sink.drop(tap.index, DropReason.ENCODE_ERROR)
            return
        self.sink.record(tap.index, record, ready_mono_ns)

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
