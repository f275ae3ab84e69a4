"""The scheduler: recorded pacing divided by speed, max speed bounded by
concurrency, late records skipped, memory bounded whatever the source rate.

The tests run on fake time (``tests/support/fake_time.py``): a sleep moves
the loop's clock and takes no wall time, and the scheduler reads that clock.
What they assert on times is then exact, whatever the host's load."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shadow_proxy.replay.schedule import ScheduleConfig, Scheduler
from tests.support.fake_time import loop_ns, on_fake_time

pytestmark = pytest.mark.timeout(30)
MS = 1_000_000


async def items(arrivals_ms: list[float | None]) -> AsyncIterator[tuple[int, int | None]]:
    base = 1_700_000_000_000 * MS
    for k, at in enumerate(arrivals_ms):
        yield k, None if at is None else base + int(at * MS)


class Recorder:
    """A send that records when each item went out and how many ran at once."""

    def __init__(self, hold_s: float = 0.0) -> None:
        self.hold_s = hold_s
        self.sent: dict[int, float] = {}
        self.running = 0
        self.most = 0
        self.late: list[int] = []
        self.start = asyncio.get_running_loop().time()

    async def send(self, item: int) -> None:
        self.sent[item] = asyncio.get_running_loop().time() - self.start
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.hold_s)
        finally:
            self.running -= 1


class TestPacing:
    """Files go out at recorded gaps / speed; max goes out as fast as concurrency allows."""

    @on_fake_time
    async def test_recorded_gaps_divided_by_speed(self) -> None:
        rec = Recorder()
        config = ScheduleConfig(concurrency=4, speed=2.0, max_lag_s=1.0)
        await Scheduler(config, rec.send, rec.late.append, loop_ns).run(items([0, 400, 800, 1200]))
        offsets = [rec.sent[k] - rec.sent[0] for k in range(4)]
        assert offsets == pytest.approx([0.0, 0.2, 0.4, 0.6], abs=1e-6)
        assert rec.late == []

    @on_fake_time
    async def test_max_speed_uses_every_sender_and_no_more(self) -> None:
        rec = Recorder(hold_s=0.05)
        config = ScheduleConfig(concurrency=3, speed=None, max_lag_s=0.0)
        scheduler = Scheduler(config, rec.send, rec.late.append, loop_ns)
        await scheduler.run(items([0, 10_000, 20_000] * 4))
        assert len(rec.sent) == 12 and rec.late == []
        assert rec.most == 3
        # Recorded gaps of 10 s ignored: four waves of three, 0.05 s each.
        assert sorted(rec.sent.values()) == pytest.approx(
            [0.0] * 3 + [0.05] * 3 + [0.1] * 3 + [0.15] * 3, abs=1e-6
        )
        assert scheduler.counts.sent == 12 and scheduler.counts.in_flight == 0


class TestLate:
    """An item taken more than max_lag_s after it was due is skipped and counted."""

    @on_fake_time
    async def test_busy_sender_makes_records_late(self) -> None:
        rec = Recorder(hold_s=0.3)
        config = ScheduleConfig(concurrency=1, speed=1.0, max_lag_s=0.1)
        scheduler = Scheduler(config, rec.send, rec.late.append, loop_ns)
        await scheduler.run(items([0, 10, 20, 500]))
        assert sorted(rec.sent) == [0, 3]
        assert rec.late == [1, 2]
        assert scheduler.counts.late == 2

    @on_fake_time
    async def test_live_records_are_due_on_receipt(self) -> None:
        rec = Recorder(hold_s=0.3)
        config = ScheduleConfig(concurrency=1, max_lag_s=0.1, live=True)
        await Scheduler(config, rec.send, rec.late.append, loop_ns).run(items([None, None, None]))
        assert sorted(rec.sent) == [0] and rec.late == [1, 2]


class TestBound:
    """A source far faster than the senders waits: items held stay within the bound."""

    @on_fake_time
    async def test_fast_live_source(self) -> None:
        produced = 0
        rec = Recorder(hold_s=0.01)
        config = ScheduleConfig(concurrency=2, max_lag_s=60.0, live=True, queue_size=5)
        scheduler = Scheduler(config, rec.send, rec.late.append, loop_ns)
        held: list[int] = []

        async def source() -> AsyncIterator[tuple[int, int | None]]:
            nonlocal produced
            for k in range(300):
                produced += 1
                held.append(produced - len(rec.sent) - len(rec.late))
                yield k, None

        await scheduler.run(source())
        assert len(rec.sent) == 300
        assert scheduler.counts.max_depth <= 5
        # queue (5) + one in each sender (2) + the one being read
        assert max(held) <= 5 + 2 + 1

    @on_fake_time
    async def test_cancel_keeps_counts(self) -> None:
        rec = Recorder(hold_s=10)
        scheduler = Scheduler(ScheduleConfig(concurrency=2), rec.send, rec.late.append, loop_ns)
        task = asyncio.create_task(scheduler.run(items([0, 0, 0, 0])))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert scheduler.counts.read >= 2 and scheduler.counts.sent == 2
        assert scheduler.counts.in_flight == 0


class TestConfig:
    """Invalid settings name the field and the value."""

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"concurrency": 0}, "'concurrency' must be at least 1 \\(got 0\\)"),
            ({"concurrency": 1, "speed": 0.0}, "'speed' must be above 0"),
            ({"concurrency": 1, "max_lag_s": -1}, "'max_lag_s' must be at least 0"),
        ],
    )
    def test_rejected(self, kwargs: dict, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            ScheduleConfig(**kwargs)
