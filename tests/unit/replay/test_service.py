"""The service's gate: --sample by hash, --max-rps as a token bucket, a full
queue dropped with a reason, and reading that stops when told."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

from shadow_proxy.devtools.processes import reserve_port
from shadow_proxy.records import filters, sources
from shadow_proxy.replay.runner import Replay, ReplayOptions
from shadow_proxy.replay.service import Gate, TokenBucket, add_arguments, sample_key

S = 1_000_000_000


class Delivered:
    def __init__(self, envelope: dict[str, Any], acks: list[str]) -> None:
        self.envelope = envelope
        self._acks = acks

    async def ack(self) -> None:
        self._acks.append(self.envelope["request_id"])


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def replay() -> Replay:
    return Replay(ReplayOptions(candidate="http://127.0.0.1:9", out_dir=None), "test")


def envelope(k: int, tokens: list[int] | None = None) -> dict[str, Any]:
    return {"request_id": f"r{k}", "request": {"token_ids": tokens or [k, k + 1]}}


class TestTokenBucket:
    """R a second, a burst of one second's worth, at least one."""

    def test_rate(self) -> None:
        now = [0]
        bucket = TokenBucket(5.0, clock=lambda: now[0])
        assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]
        now[0] += S // 5
        assert bucket.take() and not bucket.take()
        now[0] += 10 * S
        assert sum(bucket.take() for _ in range(10)) == 5

    def test_below_one(self) -> None:
        now = [0]
        bucket = TokenBucket(0.5, clock=lambda: now[0])
        assert bucket.take() and not bucket.take()
        now[0] += 2 * S
        assert bucket.take()


class TestSample:
    """The tap's hash: by request id, or by the first 64 prompt tokens."""

    def test_keys(self) -> None:
        assert sample_key(envelope(1), "request") == filters.request_sample_key("r1")
        a = sample_key(envelope(1, list(range(100))), "prefix")
        b = sample_key(envelope(2, [*range(64), 7, 7]), "prefix")
        assert a == b == filters.prefix_sample_key(list(range(64)))

    def test_fraction(self) -> None:
        gate = Gate(replay(), args("--sample", "0.25"), drop_when_full=True)
        refused = [gate.refusal(envelope(k)) for k in range(2000)]
        kept = refused.count(None)
        assert set(refused) == {None, "sampled_out"} and 400 < kept < 600
        assert refused == [gate.refusal(envelope(k)) for k in range(2000)]  # stable


class TestGate:
    """What is refused is counted by reason and acknowledged."""

    async def test_counted_and_acknowledged(self) -> None:
        r = replay()
        gate = Gate(r, args("--max-rps", "3"), drop_when_full=True)
        acks: list[str] = []

        async def source() -> AsyncIterator[Delivered]:
            for k in range(10):
                yield Delivered(envelope(k), acks)

        passed = [d.envelope["request_id"] async for d in gate.passed(source(), asyncio.Event())]
        assert passed == ["r0", "r1", "r2"]
        assert r.tally.skipped == {"rate_limited": 7} and len(acks) == 7

    async def test_full_queue(self) -> None:
        r = replay()
        for k in range(r.scheduler.config.bound):
            r.scheduler._queue.put_nowait((k, None))
        assert Gate(r, args(), drop_when_full=True).refusal(envelope(0)) == "queue_full"
        assert Gate(r, args(), drop_when_full=False).refusal(envelope(0)) is None

    async def test_stops_reading(self) -> None:
        """A source that waits forever is left when stop is set."""
        stop = asyncio.Event()

        async def quiet() -> AsyncIterator[Delivered]:
            yield Delivered(envelope(0), [])
            await asyncio.Event().wait()
            yield Delivered(envelope(1), [])

        got = []

        async def read() -> None:
            async for d in Gate(replay(), args(), drop_when_full=True).passed(quiet(), stop):
                got.append(d.envelope["request_id"])
                stop.set()

        await asyncio.wait_for(read(), 5)
        assert got == ["r0"]


class TestServe:
    """The service until a signal, in front of a live tap that sends nothing."""

    async def test_sigterm_is_said_in_the_summary(self) -> None:
        from shadow_proxy.replay.live import LiveObserver
        from shadow_proxy.replay.service import make_observer, serve

        options = ReplayOptions(candidate="http://127.0.0.1:9", out_dir=None)
        observer: LiveObserver = make_observer(options, 10.0)
        r = Replay(options, "test", observer=observer)
        source = sources.TapSource([f"tcp://127.0.0.1:{reserve_port()}"], "t")
        said: list[str] = []

        def say(line: str) -> None:
            said.append(line)
            if line.startswith("serving "):
                os.kill(os.getpid(), signal.SIGTERM)

        a = args("--metrics-port", "0", "--grace-s", "5")
        summary, stopped = await asyncio.wait_for(serve(r, observer, source, a, say), 30)
        assert stopped == signal.SIGTERM
        assert summary["run"]["stopped_by"] == "signal"
        assert any(line.startswith("SIGTERM: stopping") for line in said)
