"""One replay run: records in, requests out, pairs compared, report written.

``Replay.run`` runs once per invocation of ``shadow-replay``. It takes an async
iterable of records (``sources.Delivery`` values, or decoded envelopes), reads
at most ``max_records`` of them or for ``duration_s`` (``Replay.limit``),
builds each record's request (``request.build_request``; records that cannot
be replayed are counted by reason), paces them (``schedule.Scheduler``), sends
each to the candidate and, with a baseline, to the baseline at the same moment,
compares both answers with the primary's (``compare``), counts
(``stats.Tally``) and writes the pair line as it finishes. A delivery is
acknowledged only once its pair line is written (or it was counted as
skipped), so a JetStream record that was in flight when the run stopped is
delivered again to the next run.

``check_targets`` runs before: every target must answer ``GET /v1/models``.

Whatever ends the run, the report of what was done is written before ``run``
returns or raises: ``summary["run"]["stopped_by"]`` says what ended it (``end``
of the source, ``max_records``, ``duration``, ``signal``: the run was
cancelled, ``error``: the source or the run failed, and ``run.error`` says
how; the exception is raised again once the report is written), and
``complete`` is true unless a signal or an error cut the run short.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TextIO, TypeVar

from shadow_proxy.records.limits import Limited
from shadow_proxy.replay.client import CandidateClient
from shadow_proxy.replay.closed_loop import ClosedLoop
from shadow_proxy.replay.compare import Observation, compare, primary_observation
from shadow_proxy.replay.options import ReplayOptions, load_tokenizer
from shadow_proxy.replay.report import PairsWriter, write_report
from shadow_proxy.replay.request import CandidateRequest, Skip, build_request
from shadow_proxy.replay.run_facts import Warmup, progress_line, run_facts
from shadow_proxy.replay.schedule import ScheduleConfig, Scheduler
from shadow_proxy.replay.scorer import Scorer, score_record
from shadow_proxy.replay.scores import ScoreTally
from shadow_proxy.replay.stats import Samples, Tally
from shadow_proxy.replay.verdicts import default_tolerance
from shadow_proxy.replay.window import PairObserver

PROGRESS_INTERVAL_S = 0.5
#: ``summary["run"]["stopped_by"]`` values.
STOPPED_BY = ("end", "max_records", "duration", "signal", "error")

T = TypeVar("T")
Ack = Callable[[], Awaitable[None]]
Item = tuple[Mapping[str, Any], CandidateRequest, Ack | None]


class _Delivered(Protocol):
    """A record as a source delivered it (``records.sources.Delivery``)."""

    @property
    def envelope(self) -> Any: ...

    async def ack(self) -> None: ...


Record = Mapping[str, Any] | _Delivered


def _unwrap(record: Record) -> tuple[Mapping[str, Any], Ack | None]:
    """The envelope of a record, and its acknowledgement (None for a bare envelope)."""
    if isinstance(record, Mapping):
        return record, None
    return record.envelope, record.ack


class Replay:
    """A replay run; ``run`` once."""

    def __init__(
        self,
        options: ReplayOptions,
        command: str,
        err: TextIO | None = None,
        observer: PairObserver | None = None,
    ) -> None:
        self.options = options
        self.observer = observer
        self.command = command
        self.err = err if err is not None else sys.stderr
        has_baseline = options.baseline is not None and options.compare
        self.tally = Tally(
            has_baseline=has_baseline,
            tolerance=default_tolerance(has_baseline)
            if options.tolerance is None
            else options.tolerance,
            min_diff_ms=options.min_diff_ms,
            max_error_rate=options.max_error_rate,
            samples=Samples(max_samples=options.max_samples),
        )
        self.scheduler: Scheduler[Item] = Scheduler(
            ScheduleConfig(
                concurrency=options.concurrency,
                speed=options.speed,
                max_lag_s=options.max_lag_s,
                live=options.live,
            ),
            self._send,
            self._late,
        )
        self._tokenizer = load_tokenizer(options.tokenizer) if options.tokenizer else None
        self._loop: ClosedLoop | None = None
        if options.closed_loop:
            if self._tokenizer is None:
                msg = "'--closed-loop' needs '--tokenizer': answers are re-encoded in their frame"
                raise ValueError(msg)
            tokenizer = self._tokenizer
            self._loop = ClosedLoop(
                self._build,
                self._send_turn,
                lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
                options.speed,
            )
        self.warmup = Warmup(options.warmup, options.warmup_s)
        self._candidate: CandidateClient | None = None
        self._baseline: CandidateClient | None = None
        self._pairs: PairsWriter | None = None
        if options.score and "baseline" not in options.targets:
            msg = "'--score' needs '--baseline' (the noise floor) and comparing outputs"
            raise ValueError(msg)
        self.scores = (
            ScoreTally(max_samples=options.max_samples, top_k=options.score_top_k)
            if options.score
            else None
        )
        self._scorers: dict[str, Scorer] = {}
        self._sends = 0
        #: Bytes read of the source and in all, for the progress line (files).
        self.progress_of: Callable[[], tuple[int, int] | None] | None = None

    def _client(self, target: str) -> CandidateClient:
        o = self.options
        return CandidateClient(
            o.targets[target],
            target=target,
            concurrency=o.concurrency,
            tokenizer=self._tokenizer if o.compare else None,
            connect_timeout_s=o.connect_timeout_s,
            read_timeout_s=o.read_timeout_s,
        )

    async def check_targets(self) -> None:
        """Every target answers ``GET /v1/models`` (and lists ``--model`` when
        given); ``client.TargetUnavailable`` names the first that does not."""
        for target in self.options.targets:
            client = self._client(target)
            try:
                names = await client.check(self.options.model)
            finally:
                await client.close()
            if self.scores is not None:  # the engine must return prompt log-probabilities
                scorer = self._scorer(target)
                try:
                    await scorer.probe(self.options.model or (names[0] if names else "model"))
                finally:
                    await scorer.close()

    def _scorer(self, target: str) -> Scorer:
        o = self.options
        return Scorer(
            o.targets[target],
            target=target,
            top_k=o.score_top_k,
            concurrency=2 * o.concurrency,
            connect_timeout_s=o.connect_timeout_s,
            read_timeout_s=o.read_timeout_s,
        )

    def limit(self, records: AsyncIterable[T]) -> Limited[T]:
        """``records`` up to ``--max-records`` / ``--duration``. A caller that
        reorders records (files) limits before, so that no more than N are read,
        and passes the result to ``run`` as ``limited``."""
        return Limited(
            records, max_records=self.options.max_records, duration_s=self.options.duration_s
        )

    async def run(
        self,
        records: AsyncIterable[Record],
        unreadable: Callable[[], Mapping[str, int]] | None = None,
        *,
        limited: Limited[Any] | None = None,
    ) -> dict[str, Any]:
        """Replay the records (limited here unless ``limited`` says the caller
        did); returns the summary (also written to DIR)."""
        o = self.options
        started_wall = datetime.datetime.now(datetime.UTC)
        started = time.monotonic()
        cpu_started = time.process_time()
        stopped_by, error = "end", None
        self._pairs = PairsWriter(o.out_dir) if o.out_dir is not None else None
        self._candidate = self._client("candidate")
        self._baseline = self._client("baseline") if "baseline" in o.targets else None
        if self.scores is not None:
            self._scorers = {t: self._scorer(t) for t in o.targets}
        if limited is None:
            records = limited = self.limit(records)
        progress = asyncio.create_task(self._progress(started)) if self.err.isatty() else None
        failure: BaseException | None = None
        try:
            if self._loop is None:
                await self.scheduler.run(self._items(records))
            else:
                await self.scheduler.run(self._items(self._loop.first_turns(records)))
                await self._loop.drain()
            stopped_by = limited.stopped_by or "end"
        except asyncio.CancelledError:
            stopped_by = "signal"
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except Exception as exc:  # the source or the run failed: report, then raise
            stopped_by, error, failure = "error", f"{type(exc).__name__}: {exc}", exc
        finally:
            elapsed = time.monotonic() - started
            cpu = time.process_time() - cpu_started
            if progress is not None:
                progress.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await progress
                print(file=self.err)
            if self._loop is not None:
                self._loop.cancel()
            if self._pairs is not None:
                self._pairs.close()
            await self._candidate.close()
            if self._baseline is not None:
                await self._baseline.close()
            for scorer in self._scorers.values():
                await scorer.close()
        run = run_facts(
            o,
            self.scheduler,
            unreadable,
            (started_wall, elapsed, cpu),
            stopped_by,
            self.warmup.excluded,
        )
        if error is not None:
            run["error"] = error
        closed = None if self._loop is None else self._loop.summary()
        if o.out_dir is None:
            summary = {**self.tally.summary(), "run": run}
            if closed is not None:
                summary["closed_loop"] = closed
        else:
            summary = write_report(
                o.out_dir, self.tally, run, self.command, self.scores, closed_loop=closed
            )
        if failure is not None:
            raise failure
        return summary

    async def _items(
        self, records: AsyncIterable[Record]
    ) -> AsyncIterator[tuple[Item, int | None]]:
        async for record in records:
            envelope, ack = _unwrap(record)
            built = self._build(envelope)
            if isinstance(built, Skip):
                self.skip(built.reason)
                if ack is not None:
                    await ack()
                continue
            arrival = envelope.get("arrival_unix_ns")
            yield (envelope, built, ack), arrival if isinstance(arrival, int) else None

    def skip(self, reason: str) -> None:
        """Count one record not sent (the tally, and the observer)."""
        self.tally.skip(reason)
        if self.observer is not None:
            self.observer.skipped(reason)

    def _build(self, envelope: Mapping[str, Any]) -> CandidateRequest | Skip:
        o = self.options
        return build_request(
            envelope, model=o.model, compare=o.compare, request_id_header=o.request_id_header
        )

    async def _late(self, item: Item) -> None:
        self.skip("late")
        if self._loop is not None:
            self._loop.done(item[0], None)
        ack = item[2]
        if ack is not None:  # counted: handled (a late record is not sent again)
            await ack()

    async def _send_turn(self, record: Record, request: CandidateRequest) -> None:
        envelope, ack = _unwrap(record)
        await self._send((envelope, request, ack))

    async def _send(self, item: Item) -> None:
        envelope, request, ack = item
        candidate = None
        try:
            candidate = await self._replay(envelope, request)
        finally:
            if self._loop is not None:
                self._loop.done(envelope, candidate)
        if ack is not None:
            await ack()  # its pair line is written

    async def _replay(self, envelope: Mapping[str, Any], request: CandidateRequest) -> Observation:
        assert self._candidate is not None
        if self._loop is not None:
            self._loop.sending(envelope)
        if self._baseline is None:
            candidate = await self._candidate.send(request)
            baseline: Observation | None = None
        else:
            # Both at the same moment, each sent first every other time: the one
            # sent first gets ahead (one deployment serving both queues the
            # second; two on one machine share its CPU), which would read as a
            # difference.
            self._sends += 1
            if self._sends % 2:
                candidate, baseline = await asyncio.gather(
                    self._candidate.send(request), self._baseline.send(request)
                )
            else:
                baseline, candidate = await asyncio.gather(
                    self._baseline.send(request), self._candidate.send(request)
                )
        line: dict[str, Any] = {
            "request_id": request.request_id,
            "tap": envelope.get("tap"),
            "seq": envelope.get("seq"),
            "model": request.body["model"],
            "prompt_tokens": request.prompt_tokens,
            "sent_ids": {target: request.sent_id(target) for target in self.options.targets},
        }
        warm = self.warmup.warming(envelope)
        if self._loop is not None:
            line.update(self._loop.line(envelope))
        if warm:
            line["warmup"] = True
            self._write({**line, "candidate": candidate.to_json()})
            return candidate
        if not self.options.compare:
            self.tally.add(None, candidate, None)
            if self.observer is not None:
                self.observer.pair(request, None, candidate, None, None, None)
            if self._loop is not None:
                self._loop.observe(envelope, None, candidate)
            self._write({**line, "candidate": candidate.to_json()})
            return candidate
        primary = primary_observation(envelope)
        if self._loop is not None:
            self._loop.observe(envelope, primary, candidate)
        diff = compare(primary, candidate, request.prompt_tokens)
        base_diff = None if baseline is None else compare(primary, baseline, request.prompt_tokens)
        judged = self.tally.add(primary, candidate, diff, baseline, base_diff)
        if self.observer is not None:
            self.observer.pair(request, primary, candidate, diff, baseline, base_diff)
        if self._pairs is None:
            return candidate
        line.update(primary=primary.to_json(), candidate=candidate.to_json())
        line["candidate_diff"] = diff.to_json()
        if baseline is not None and base_diff is not None:
            line.update(baseline=baseline.to_json(), baseline_diff=base_diff.to_json())
        line["counted"] = judged
        if self.scores is not None and baseline is not None and base_diff is not None:
            exact = (diff.output_equal, base_diff.output_equal)
            lengths = (candidate.exact_tokens, baseline.exact_tokens)
            scorers = self._scorers["candidate"], self._scorers["baseline"]
            line["score"] = await score_record(
                *scorers, self.scores, envelope, request, exact, lengths
            )
        self._pairs.write(line)
        return candidate

    def _write(self, line: Mapping[str, Any]) -> None:
        """One pairs.jsonl line (none without ``--out``: the live service)."""
        if self._pairs is not None:
            self._pairs.write(line)

    async def _progress(self, started: float) -> None:
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            read = self.progress_of() if self.progress_of is not None else None
            self.err.write(progress_line(self.tally, self.scheduler, started, read))
            self.err.flush()
