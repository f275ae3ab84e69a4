"""``shadow-replay`` as a live shadow service (``--metrics-port``): it reads a
live source until SIGTERM/SIGINT and serves rolling verdicts on ``/metrics``.

The flow, one record at a time: the source (a live tap, or a JetStream
durable) -> ``Gate`` (``--sample``, ``--max-rps``, and a full queue) -> the
replay's scheduler (``--concurrency`` in flight per target) -> the candidate
(and the baseline) -> ``live.LiveObserver`` (counters, histograms, the
rolling window). Every ``live.REFRESH_S`` seconds the window is judged
(``window.Window.preparing`` in steps, then the bootstrap in the judge
process, ``judging``: the batch report's statistics, away from the loop that
serves ``/metrics``) and the gauges are set.

What the gate refuses is counted in ``shadow_replay_skipped_total`` by reason
and acknowledged (it was handled: a durable does not deliver it again):

- ``sampled_out``: outside ``--sample`` (a hash of the request id, or with
  ``--sample-by prefix`` of the first 64 prompt tokens: the tap's
  ``sample_by: prefix``, the turns of one conversation in or out together);
- ``rate_limited``: past the token bucket of ``--max-rps`` (a burst of one
  second's worth);
- ``queue_full``: the scheduler's queue (2 x ``--concurrency`` records) is
  full because the targets are slower than the source. A live tap drops the
  record here rather than wait (waiting would only move the loss into the
  socket's buffer, uncounted); a JetStream durable waits instead, the stream
  holds what is not yet read.

A candidate that is down or slow costs at most ``--concurrency`` requests in
flight, each bounded by ``--connect-timeout-s`` / ``--read-timeout-s``; its
failures are counted (``outcome`` error or timeout) and the next records go
to it as usual, so replay resumes on its own when it answers again.

SIGTERM (or SIGINT): stop reading, let the requests in flight and queued
finish within ``--grace-s`` (then cancel them), write the report of the whole
run when ``--out`` is given, exit 0 (130 after SIGINT).

Once serving, the objects made at start-up (the imports, the tokenizer: 50,000
to 90,000 tracked by the garbage collector) are frozen out of its reach
(``gc.freeze``): a full collection then walks only what the run holds (the
window's pairs), and the pause it puts between two scrapes of ``/metrics``
stays short (in the replayer, full collections over 70,000 to 99,000 objects
took 26 to 84 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from shadow_proxy.arguments import fraction, positive
from shadow_proxy.records import filters, sources
from shadow_proxy.replay.judging import JudgeFailed, JudgeProcess
from shadow_proxy.replay.live import REFRESH_S, LiveMetrics, LiveObserver, make_app
from shadow_proxy.replay.verdicts import default_tolerance
from shadow_proxy.replay.window import DEFAULT_WINDOW_S, Window

if TYPE_CHECKING:
    from shadow_proxy.replay.runner import Replay, ReplayOptions

DEFAULT_GRACE_S = 30.0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The service's flags (``--metrics-port`` turns it on)."""
    group = parser.add_argument_group("live shadow service (with --metrics-port)")
    group.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="run until SIGTERM, serving /metrics and /healthz on this port (0: any free one)",
    )
    group.add_argument("--metrics-host", default="127.0.0.1", help="[%(default)s]")
    group.add_argument(
        "--window-s",
        type=positive(float),
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help="verdicts over the pairs of the last S seconds [%(default)s]",
    )
    group.add_argument(
        "--sample",
        type=fraction,
        default=1.0,
        metavar="F",
        help="replay this fraction of the records (a hash of --sample-by's key) [%(default)s]",
    )
    group.add_argument(
        "--sample-by",
        choices=("request", "prefix"),
        default="request",
        help="the request id, or the prompt's first 64 tokens (a conversation) [%(default)s]",
    )
    group.add_argument(
        "--max-rps",
        type=positive(float),
        metavar="R",
        help="replay at most R records a second (the rest counted as rate_limited)",
    )
    group.add_argument(
        "--grace-s",
        type=positive(float),
        default=DEFAULT_GRACE_S,
        metavar="S",
        help="on SIGTERM, wait up to S s for the requests in flight [%(default)s]",
    )


class TokenBucket:
    """``rate`` tokens a second, at most ``rate`` (at least 1) held."""

    def __init__(self, rate: float, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self._clock = clock
        self._last = clock()

    def take(self) -> bool:
        now = self._clock()
        self.tokens = min(self.capacity, self.tokens + (now - self._last) / 1e9 * self.rate)
        self._last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def sample_key(envelope: Any, sample_by: str) -> bytes:
    """The record's sampling key (as the tap computes it)."""
    if sample_by == "prefix":
        request = envelope.get("request") or {}
        token_ids = request.get("token_ids")
        if isinstance(token_ids, list):
            return filters.prefix_sample_key(token_ids)
    return filters.request_sample_key(str(envelope.get("request_id", "")))


class Gate:
    """Which deliveries go on to the replay (see the module doc)."""

    def __init__(self, replay: Replay, args: argparse.Namespace, drop_when_full: bool) -> None:
        self.replay = replay
        self.sample = args.sample
        self.sample_by = args.sample_by
        self.bucket = TokenBucket(args.max_rps) if args.max_rps else None
        self.drop_when_full = drop_when_full

    def refusal(self, envelope: Any) -> str | None:
        """Why this record is not replayed, or None."""
        if self.sample < 1 and not filters.sample_in(
            sample_key(envelope, self.sample_by), self.sample
        ):
            return "sampled_out"
        if self.bucket is not None and not self.bucket.take():
            return "rate_limited"
        scheduler = self.replay.scheduler
        if self.drop_when_full and scheduler.depth >= scheduler.config.bound:
            return "queue_full"
        return None

    async def passed(
        self, deliveries: AsyncIterator[sources.Delivery], stop: asyncio.Event
    ) -> AsyncIterator[sources.Delivery]:
        """The deliveries let through, until ``stop`` is set."""
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while True:
                step = asyncio.ensure_future(anext(deliveries))
                await asyncio.wait({step, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await step
                    return
                try:
                    delivery = step.result()
                except StopAsyncIteration:
                    return
                reason = None if delivery.envelope is None else self.refusal(delivery.envelope)
                if reason is None:
                    yield delivery
                    continue
                self.replay.skip(reason)
                await delivery.ack()
        finally:
            stopped.cancel()


def make_observer(options: ReplayOptions, window_s: float) -> LiveObserver:
    """The window and metrics of a run with these options."""
    has_baseline = "baseline" in options.targets
    tolerance = options.tolerance
    window = Window(
        has_baseline=has_baseline,
        tolerance=default_tolerance(has_baseline) if tolerance is None else tolerance,
        min_diff_ms=options.min_diff_ms,
        max_error_rate=options.max_error_rate,
        window_s=window_s,
    )
    metrics = LiveMetrics(CollectorRegistry(), tuple(options.targets))
    return LiveObserver(window, metrics)


async def _refresh(observer: LiveObserver, judge: JudgeProcess) -> None:
    """Judge the window every ``REFRESH_S``, the judging included: the counts in
    steps, the bootstrap in the judge process (the loop keeps serving). A
    refresh whose judge process failed publishes nothing (it was counted)."""
    while True:
        started = time.monotonic()
        pairs = observer.window.pairs(time.monotonic_ns())
        steps = observer.window.preparing(pairs)
        while True:  # in the loop, a step at a time (a thread would contend for the GIL)
            try:
                next(steps)
            except StopIteration as done:
                prepared = done.value
                break
            await asyncio.sleep(0)
        with contextlib.suppress(JudgeFailed):
            observer.publish(prepared.snapshot(await judge.judge(prepared.request)))
        await asyncio.sleep(max(0.0, REFRESH_S - (time.monotonic() - started)))


async def serve(
    replay: Replay,
    observer: LiveObserver,
    source: sources.RecordSource,
    args: argparse.Namespace,
    say: Callable[[str], None],
) -> tuple[dict[str, Any], int | None]:
    """Run the service until the source ends or a signal; returns the
    summary and the signal that stopped it (None when the source ended)."""
    from shadow_proxy.replay.client import TargetUnavailable

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stopped: list[int] = []
    limited = replay.limit(source.deliveries())

    def on_signal(sig: int) -> None:
        if not stopped:
            say(f"{signal.Signals(sig).name}: stopping (grace {args.grace_s:g} s)")
        stopped.append(sig)
        limited.stopped_by = "signal"  # the run's summary says so, not "end"
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    runner = web.AppRunner(make_app(observer), handler_cancellation=True, access_log=None)
    await runner.setup()
    judge = JudgeProcess(say, observer.metrics.judge_crashes.inc)
    refresher = asyncio.create_task(_refresh(observer, judge), name="replay-window")
    try:
        site = web.TCPSite(runner, args.metrics_host, args.metrics_port)
        await site.start()
        port = runner.addresses[0][1]
        say(f"serving /metrics and /healthz on http://{args.metrics_host}:{port}")
        await source.open()
        try:
            await replay.check_targets()
        except TargetUnavailable as exc:  # a service waits for its candidate
            say(f"{exc}; replaying anyway (failures are counted)")
        gc.freeze()  # start-up's objects stay: full collections walk only the run's
        gate = Gate(replay, args, drop_when_full=not source.redelivers)
        records: AsyncIterable[Any] = gate.passed(aiter(limited), stop)
        run = asyncio.create_task(
            replay.run(records, lambda: source.stats.unreadable, limited=limited)
        )
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({run, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        observer.reading = False
        try:
            summary = await asyncio.wait_for(asyncio.shield(run), args.grace_s)
        except TimeoutError:
            say(f"requests still in flight after {args.grace_s:g} s: cancelled")
            run.cancel()
            summary = await run
        return summary, (stopped[0] if stopped else None)
    finally:
        observer.reading = False
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher
        await judge.aclose()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        await source.aclose()


def main(
    replay: Replay,
    observer: LiveObserver,
    source: sources.RecordSource,
    args: argparse.Namespace,
    say: Callable[[str], None],
    headline: Callable[[dict[str, Any]], str],
) -> int:
    """``shadow-replay ... --metrics-port``: serve until SIGTERM, then the
    headline (and the report with ``--out``); the exit status."""
    import uvloop

    try:
        summary, stopped = uvloop.run(serve(replay, observer, source, args, say))
    except (sources.SourceError, OSError) as exc:
        say(str(exc))
        return EXIT_USAGE
    print(headline(summary), file=sys.stderr)
    if args.out is not None:
        print(f"report: {args.out / 'report.md'}", file=sys.stderr)
    return EXIT_INTERRUPTED if stopped == signal.SIGINT else 0
